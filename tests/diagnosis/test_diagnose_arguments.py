"""`fp4lab diagnose` honours every rule of the file that keeps a layer out of FP4 (None, bf16,
fp8...), says which it kept, and refuses what would fail after stage 1 before stage 1 runs."""

from pathlib import Path

import pytest

import fp4lab as fl
from fp4lab import cli
from fp4lab.diagnosis import command, probe

FILE = """
import jax
import jax.numpy as jnp
from flax import nnx
import fp4lab as fl


class Net(nnx.Module):
    def __init__(self, rngs):
        self.a = nnx.Linear(16, 16, rngs=rngs)
        self.head = nnx.Linear(16, 16, rngs=rngs)

    def __call__(self, x):
        return self.head(jnp.tanh(self.a(x)))


def model(config, rngs):
    return Net(rngs)


def loss(model, batch):
    return jnp.mean((model(batch) - jnp.sin(batch)) ** 2)


def batch(key, step):
    return jax.random.normal(key, (16, 16))


def get_config():
    return fl.Config(batch_size=16, steps=4, lr=1e-2, warmup=0, eval_batches=1,
                     rules=(("head", "bf16"), (".*", "nvfp4")))


def sweep(add):
    add(recipe="nvfp4")
"""


def test_which_recipes_keep_a_layer_out_of_fp4():
    kept = [r for r in (None, "fp32", "bf16", "fp8", "mxfp8") if probe.high_precision(r)]
    assert kept == [None, "fp32", "bf16", "fp8", "mxfp8"]
    assert not any(probe.high_precision(r) for r in ("nvfp4", "mxfp4", "nvfp4-rl", "mxfp4-h16"))
    assert not probe.high_precision(fl.recipes.get("nvfp4"))  # a value as well as a name


def test_a_rule_in_bf16_is_kept_out_of_the_diagnosis_and_said(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(FILE)
    d = fl.diagnose(experiment=path, checkpoints=(0,), batches=1, quant_seeds=1, progress=False)
    assert set(d.table["layer"]) == {"a"} and d.excluded == ("head",)
    assert "Left in high precision and out of the diagnosis: head." in d.summary


@pytest.fixture
def no_stage_1(monkeypatch):
    def ran(**kwargs):
        raise AssertionError("stage 1 started")

    monkeypatch.setattr(command.package, "diagnose", ran)


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--verify", "--verify-seeds", "1"], "--verify-seeds 1: verify needs at least 4 seeds"),
        (["--out", "FILE"], "--out FILE is a file; give a folder for the outputs"),
        (["--out", "DIR/sub"], "--out DIR/sub: DIR cannot be written; give a folder you can"),
        pytest.param(  # the access test passes; making the folder does not
            ["--out", "/proc/fp4lab"],
            "--out /proc/fp4lab cannot be written (",
            marks=pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc"),
        ),
    ],
)
def test_arguments_that_fail_after_stage_1_are_refused_before_it(
    tmp_path, capsys, monkeypatch, no_stage_1, extra, said
):
    path = tmp_path / "mine.py"
    path.write_text(FILE)
    (tmp_path / "f.txt").write_text("")
    (tmp_path / "ro").mkdir()
    swap = {"FILE": str(tmp_path / "f.txt"), "DIR": str(tmp_path / "ro")}
    for name, value in swap.items():
        extra = [x.replace(name, value) for x in extra]
        said = said.replace(name, value)
    if "DIR" in swap and str(tmp_path / "ro") in " ".join(extra):  # root writes anywhere
        monkeypatch.setattr(command.os, "access", lambda p, mode: p != tmp_path / "ro")
    assert cli.main(["diagnose", str(path), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fp4lab diagnose: error: {said}"), err


def test_an_exclusion_of_every_layer_is_said_as_such(tmp_path, recwarn):
    path = tmp_path / "mine.py"
    path.write_text(FILE)
    said = r"every quantized layer is excluded \('a', '\.\*', 'head': --exclude .*left to diagnose"
    with pytest.raises(ValueError, match=said):
        fl.diagnose(experiment=path, exclude=("a", ".*"), checkpoints=(0,), progress=False)
    # not the recipe's own rule that found nothing left ('head', shadowed by '.*', is said)
    assert not [w for w in recwarn if "rule '.*' matched no module" in str(w.message)]


def test_a_model_that_is_one_layer_is_named_the_model():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    def model(config, rngs):
        return nnx.Linear(32, 32, rngs=rngs)

    def loss(model, batch):
        return jnp.mean((model(batch) - jnp.sin(batch)) ** 2)

    def batch(key, step):
        return jax.random.normal(key, (16, 32))

    d = fl.diagnose(model, loss, batch, config={"lr": 1e-2}, checkpoints=(0,), batches=1,
                    quant_seeds=1, progress=False)  # fmt: skip
    assert set(d.table["layer"]) == {""}  # its path, which rules.py matches
    assert "the model " in d.summary and " Fprop" in d.summary
