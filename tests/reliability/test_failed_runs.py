"""Runs that fail, said in one line: `--dry-run` traces each cell and names one that would fail
(a width the block size does not divide), a failed batch's progress line gives its own reason
(not the previous cell's loss), and `run`, `plot`, `report` and `export` of a sweep whose every
run failed end in one line with the first failure's reason."""

import io
import shutil
import textwrap

import pytest

from fp4lab import cli, sweep
from fp4lab.sweep import compute, runner

BASE = """
from fp4lab.train.config import Config

def get_config():
    return Config(task="teacher", din={width}, dout=32, teacher_hidden=(32,), hidden=(32,),
                  batch_size=32, steps=2, eval_batches=1, seed_batch=2, recipe="nvfp4")

def sweep(add):
    add()
"""


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ---------------------------------------------------------------------------------------------
# --dry-run traces each cell for shapes.


def test_dry_run_names_a_width_the_block_size_does_not_divide(tmp_path, capsys):
    path = tmp_path / "exp.py"
    path.write_text(BASE.format(width=24))
    out = tmp_path / "o"
    assert cli.main(["run", str(path), "--out", str(out), "--dry-run"]) == 2
    err = one_line_error(capsys)
    assert "exp.py:" in err and "cell base would fail: ValueError:" in err
    assert "does not divide" in err
    assert not out.exists()


def test_dry_run_of_cells_that_trace_passes(tmp_path, capsys):
    path = tmp_path / "exp.py"
    path.write_text(BASE.format(width=32))
    argv = ["run", str(path), "--out", str(tmp_path / "o"), "--dry-run", "--no-probe"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().err == ""


def test_dry_run_traces_only_the_cells_with_runs_left(tmp_path, capsys, monkeypatch):
    path, out = tmp_path / "exp.py", tmp_path / "o"
    path.write_text(BASE.format(width=32))

    def finished(config, seeds):
        return [{"summary": {"final_loss": 1.0}, "series": {}, "wall_s": 0.0} for _ in seeds]

    sweep.run_experiment(sweep.load_experiment(path), out, progress=False, compute=finished)
    traced = []
    monkeypatch.setattr(compute, "check_cell", traced.append)
    assert cli.main(["run", str(path), "--out", str(out), "--dry-run"]) == 0
    assert "[1/1 done]" in capsys.readouterr().out and traced == []


# ---------------------------------------------------------------------------------------------
# Progress lines of failed batches.


def test_a_failed_batch_shows_its_reason_not_the_previous_loss():
    stream = io.StringIO()
    bar = runner.Progress(2, 2, stream, labels=["bf16 (seeds 0)", "nvfp4 (seeds 0)"], live=False)
    bar.update(cells=1, runs=1, loss=3.25, index=0)
    bar.update(cells=1, runs=1, note="failed: ValueError: no", index=1)
    done, failed = stream.getvalue().splitlines()
    assert "bf16 (seeds 0): done, loss 3.2500 |" in done
    assert "nvfp4 (seeds 0): failed: ValueError: no |" in failed and "loss" not in failed


# ---------------------------------------------------------------------------------------------
# A sweep whose every run failed.

FAILING = """
from fp4lab.train.config import Config

def get_config():  # 24 wide: NVFP4's 16-blocks do not divide it
    return Config(task="teacher", din=24, dout=24, teacher_hidden=(24,), hidden=(24,),
                  batch_size=8, steps=2, eval_batches=1, seed_batch=1, recipe="nvfp4")

def sweep(add):
    add(seeds=2)
"""


@pytest.fixture
def all_failed(tmp_path):
    path = tmp_path / "exp.py"
    path.write_text(textwrap.dedent(FAILING))
    return path, tmp_path / "res"


def test_run_of_an_all_failed_sweep_gives_the_first_reason(all_failed, capsys):
    path, out = all_failed
    assert cli.main(["run", str(path), "--out", str(out)]) == 1  # figures on: no KeyError
    text = capsys.readouterr()
    assert "failed: ValueError: layer 'layers.0': Fprop GEMM, operand x" in text.err  # progress
    assert "Traceback" not in text.err + text.out
    line = next(x for x in text.out.splitlines() if "no run finished" in x)
    assert "2 failed of 2 runs; the first (cell base): ValueError: " in line
    assert "does not divide" in line


@pytest.fixture(scope="module")
def all_failed_folder(tmp_path_factory):
    """The folder of FAILING's sweep, run once for the tests that read it (each reads a copy)."""
    tmp = tmp_path_factory.mktemp("failed")
    path = tmp / "exp.py"
    path.write_text(textwrap.dedent(FAILING))
    sweep.run_experiment(sweep.load_experiment(path), tmp / "res", progress=False)
    return tmp / "res"


@pytest.mark.parametrize("command", ["plot", "report", "export"])
def test_plot_and_report_of_an_all_failed_folder_are_one_line(
    all_failed_folder, tmp_path, capsys, command
):
    out = tmp_path / "res"
    shutil.copytree(all_failed_folder, out)
    argv = [command, "--tensorboard", str(out)] if command == "export" else [command, str(out)]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"fp4lab {command}: error: {out} holds no finished run (2 failed of 2 runs" in err
    assert "ValueError: " in err and "does not divide" in err


def test_show_of_a_partly_failed_sweep_names_the_first_failure(tmp_path, capsys):
    path = tmp_path / "exp.py"
    good = "add('ok', din=32, dout=32, teacher_hidden=(32,), hidden=(32,), seeds=1)"
    path.write_text(textwrap.dedent(FAILING).replace("add(seeds=2)", f"add(seeds=1)\n    {good}"))
    sweep.run_experiment(sweep.load_experiment(path), tmp_path / "res", progress=False)
    capsys.readouterr()
    assert cli.main(["show", str(tmp_path / "res")]) == 0
    assert "1 failed of 2 runs; the first (cell base): ValueError:" in capsys.readouterr().out
