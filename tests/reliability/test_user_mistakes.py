"""User mistakes answered before anything runs, each with one line: seeds outside the range the
key derivation uses, one config under two labels, a phase that starts between two steps, an
experiment file not named *.py."""

import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from fp4lab import cli, sweep
from fp4lab.train import trainer
from fp4lab.train.config import Config, ConfigError

BASE = """
from fp4lab.train.config import Config

def get_config():
    return Config(task="teacher", din={width}, dout=32, teacher_hidden=(32,), hidden=(32,),
                  batch_size=32, steps=2, eval_batches=1, seed_batch=2, recipe="{recipe}")

def sweep(add):
"""


def experiment(tmp_path: Path, body: str, width=32, recipe="fp32", name="exp.py") -> Path:
    path = tmp_path / name
    text = BASE.format(width=width, recipe=recipe) + textwrap.indent(textwrap.dedent(body), "    ")
    path.write_text(text)
    return path


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ---------------------------------------------------------------------------------------------
# Seeds: jax.random.key keeps a seed's low 32 bits.


def test_seeds_alias_modulo_2_32_under_the_key_derivation():
    """Why the range: these pairs give the same stream (so would run twice under two ids)."""
    for a, b in ((1, 2**32 + 1), (-1, 2**32 - 1)):
        assert np.array_equal(
            jax.random.key_data(jax.random.key(a)), jax.random.key_data(jax.random.key(b))
        )


@pytest.mark.parametrize(
    "seeds",
    [
        "[(2**32 + 1, 0, 0)]",
        '{"init": [-1]}',
        '{"quant": [0, 2**32]}',
        "[(0, 0, 2**64 + 1)]",
    ],
)
def test_seeds_outside_the_key_range_are_rejected_at_load(tmp_path, seeds):
    path = experiment(tmp_path, f"add(seeds={seeds})")
    with pytest.raises(sweep.ExperimentError, match=r"outside \[0, 4294967295\]") as e:
        sweep.load_experiment(path)
    assert len(str(e.value).splitlines()) == 1


def test_seeds_at_the_ends_of_the_range_load_with_their_ids(tmp_path):
    path = experiment(tmp_path, "add(seeds=[(0, 1, 2**32 - 1)])")
    (cell,) = sweep.load_experiment(path).cells
    assert cell.seeds == ((0, 1, 2**32 - 1),) and len(cell.run_ids()) == 1


def test_a_seed_beyond_the_range_is_one_line_from_dry_run(tmp_path, capsys):
    path = experiment(tmp_path, "add(seeds=[(2**64 + 1, 0, 0)])")  # once passed --dry-run
    assert cli.main(["run", str(path), "--out", str(tmp_path / "o"), "--dry-run"]) == 2
    assert "seed 18446744073709551617 is outside [0, 4294967295]" in one_line_error(capsys)


@pytest.mark.parametrize("seed", [2**32 + 1, -1, 2**64 + 1])
def test_make_keys_rejects_seeds_outside_the_range(seed):
    with pytest.raises(ValueError, match="outside"):
        trainer.make_keys(seed, 0, 0)


# ---------------------------------------------------------------------------------------------
# Labels and configs.


def test_one_config_under_two_labels_is_rejected_naming_both(tmp_path):
    path = experiment(tmp_path, 'add("a", recipe="bf16")\nadd("b", recipe="bf16")')
    with pytest.raises(sweep.ExperimentError) as e:
        sweep.load_experiment(path)
    text = str(e.value)
    assert "'a'" in text and "'b'" in text and "same config" in text
    assert len(text.splitlines()) == 1


def test_two_labels_of_different_configs_still_load(tmp_path):
    path = experiment(tmp_path, 'add("a", recipe="bf16")\nadd("b", recipe="bf16", lr=1e-2)')
    assert [c.label for c in sweep.load_experiment(path).cells] == ["a", "b"]


# ---------------------------------------------------------------------------------------------
# Phases: a start is a whole step or a fraction of the steps.


@pytest.mark.parametrize("start", [1.5, 2.25, float("nan"), float("inf"), 0.01])
def test_a_phase_start_between_steps_is_rejected(start):
    with pytest.raises(ConfigError, match=r"Config\.phases") as e:
        Config(steps=10, phases=((start, "bf16"),))
    assert len(str(e.value).splitlines()) == 1


def test_whole_and_fractional_phase_starts_are_kept():
    assert Config(steps=10, phases=((2, "bf16"),)).precision()[1][0] == 2
    assert Config(steps=10, phases=((2.0, "bf16"),)).precision()[1][0] == 2
    assert Config(steps=10, phases=((0.5, "bf16"),)).precision()[1][0] == 5


# ---------------------------------------------------------------------------------------------
# An experiment file without .py.


def test_experiment_file_without_py_is_one_line(tmp_path, capsys):
    path = experiment(tmp_path, "add()", name="exp")
    with pytest.raises(sweep.ExperimentError, match=r"name it \*\.py"):
        sweep.load_experiment(path)
    assert cli.main(["run", str(path), "--out", str(tmp_path / "o"), "--dry-run"]) == 2
    assert "name it *.py" in one_line_error(capsys)


@pytest.mark.parametrize("seeds", ["[(0, 0, 0), (1, 1, 1), (0, 0, 0)]", "{'init': [0, 0]}"])
def test_a_seed_triple_given_twice_is_refused_not_run_once_as_two(tmp_path, seeds):
    path = experiment(tmp_path, f"add(seeds={seeds})")
    with pytest.raises(sweep.ExperimentError, match=r"the triple \(0, 0, 0\) comes 2 times"):
        sweep.load_experiment(path)
