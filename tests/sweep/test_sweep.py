"""Experiment files, the store, the CLI, and a sweep killed mid-run that resumes."""

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from fakes import kill_after_records  # tests/fakes.py

from fp4lab import cli, sweep
from fp4lab.sweep import store
from fp4lab.sweep.index import INDEX_FILE
from fp4lab.sweep.lock import LOCK_FILE

BASE = """
from fp4lab.train.config import Config

SEEDS = 2

def get_config():
    return Config(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,),
                  batch_size=32, steps={steps}, eval_batches=1, seed_batch=2)
"""


def write_experiment(tmp_path: Path, sweep_body: str, steps: int = 3, name="exp") -> Path:
    path = tmp_path / f"{name}.py"
    body = "\ndef sweep(add):\n" + textwrap.indent(textwrap.dedent(sweep_body), "    ")
    path.write_text(BASE.format(steps=steps) + body)
    return path


def line_of(path: Path, text: str) -> int:
    """The line number of the first line of `path` that contains `text` (its first line)."""
    first = text.splitlines()[0]
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if first in line)


# ---------------------------------------------------------------------------------------------
# Experiment files.


def test_load_experiment_cells_seeds_and_ids(tmp_path):
    path = write_experiment(
        tmp_path,
        """
        add(recipe="fp32")
        add("sgd", optimizer="sgd", seeds={"init": [0, 1], "quant": [5]})
        add(recipe="bf16", seeds=[(1, 2, 3)])
        """,
    )
    exp = sweep.load_experiment(path)
    assert [c.label for c in exp.cells] == ["recipe=fp32", "sgd", "recipe=bf16"]
    assert exp.cells[0].seeds == ((0, 0, 0), (1, 1, 1))  # SEEDS = 2, same integer per stream
    assert exp.cells[1].seeds == ((0, 0, 5), (1, 0, 5))  # product over streams
    assert exp.cells[2].seeds == ((1, 2, 3),)
    ids = [r for c in exp.cells for r in c.run_ids()]
    assert len(set(ids)) == len(ids) == exp.n_runs == 5
    again = sweep.load_experiment(path)
    assert [r for c in again.cells for r in c.run_ids()] == ids  # ids are stable
    forced = sweep.load_experiment(path, seeds=3, steps=7)
    assert all(c.seeds == ((0, 0, 0), (1, 1, 1), (2, 2, 2)) for c in forced.cells)
    assert all(c.config.steps == 7 for c in forced.cells)
    assert not set(forced.cells[0].run_ids()) & set(ids)  # other steps, other runs


@pytest.mark.parametrize(
    "body, message",
    [
        (
            'add(recipe="nvfp5")',
            "exp.py:{line}: cell recipe=nvfp5: Config.recipe='nvfp5'; allowed:",
        ),
        ('add(lr="fast")', "exp.py:{line}: cell lr=fast: Config.lr='fast' (str); must be float"),
        ("add(learning_rate=0.1)", "unknown config fields ['learning_rate']; allowed: task,"),
        ('add(gemms={"wgrad": "fp5"})', "Config.gemms['wgrad']='fp5'; allowed: 'fp32'"),
        ("add(seeds=0)", "seeds=0; must be >= 1"),
        ('add(seeds={"noise": [1]})', "seeds has unknown streams ['noise']"),
        ("pass", "sweep(add) added no cells"),
        ('add(recipe="bf16")\nadd(recipe="bf16")', "cells with the same label ['recipe=bf16']"),
    ],
)
def test_experiment_errors_name_file_field_and_allowed(tmp_path, body, message):
    path = write_experiment(tmp_path, body)
    with pytest.raises(sweep.ExperimentError) as e:
        sweep.load_experiment(path)
    assert message.format(line=line_of(path, body)) in str(e.value)


def test_experiment_without_get_config(tmp_path):
    path = tmp_path / "x.py"
    path.write_text("def sweep(add):\n    add()\n")
    with pytest.raises(sweep.ExperimentError, match="defines no get_config"):
        sweep.load_experiment(path)


def test_cli_reports_errors_before_running(tmp_path, capsys):
    path = write_experiment(tmp_path, 'add(recipe="bf16")\nadd(recipe="nvfp5")')
    out = tmp_path / "out"
    assert cli.main(["run", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        f"exp.py:{line_of(path, 'nvfp5')}: cell recipe=nvfp5" in err
        and "nvfp5" in err
        and "allowed: 'fp32'" in err
    )
    assert not (out / "runs").exists()  # nothing ran


def test_cli_dry_run_lists_cells(tmp_path, capsys):
    path = write_experiment(tmp_path, 'add(recipe="fp32")\nadd(recipe="bf16", seeds=3)')
    argv = ["run", str(path), "--out", str(tmp_path / "o"), "--dry-run", "--no-probe"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "2 cells, 5 runs" in text
    assert "recipe=fp32  seeds(init/data/quant) 0/0/0 1/1/1  [0/2 done]" in text
    assert "recipe=bf16  seeds(init/data/quant) 0/0/0 1/1/1 2/2/2  [0/3 done]" in text
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------
# The store.


def test_run_show_ls_and_load(tmp_path, capsys):
    path = write_experiment(tmp_path, 'add(recipe="fp32")\nadd(recipe="bf16", lr=1e-2)')
    out = tmp_path / "res"
    assert cli.main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "4 runs done, 0 already finished, 0 failed" in text and "loss gap" in text
    res = store.load(out)
    assert list(res.runs["cell"]) == ["recipe=fp32"] * 2 + ["recipe=bf16,lr=0.01"] * 2
    assert set(res.runs["status"]) == {"ok"}
    assert (res.runs["loss_floor"] == 0).all() and np.isfinite(res.runs["final_loss"]).all()
    assert {"recipe", "lr", "seed_init", "seed_data", "seed_quant", "loss_gap"} <= set(res.runs)
    m = res.metrics
    assert set(m.columns) == {"run_id", "step", "metric", "value"}
    losses = m[(m.metric == "loss")].groupby("run_id").step.count()
    assert (losses == 3).all() and len(losses) == 4
    record = json.loads(next((out / "runs").glob("*.json")).read_text())
    assert record["provenance"]["versions"]["jax"] and record["provenance"]["backend"] == "cpu"
    assert cli.main(["ls", str(out)]) == 0
    assert "recipe=fp32" in capsys.readouterr().out
    assert cli.main(["show", str(out)]) == 0
    # a second run skips everything
    assert cli.main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    assert "0 runs done, 4 already finished" in capsys.readouterr().out


def test_experiment_analyze_tables_are_written_and_printed(tmp_path, capsys):
    path = write_experiment(tmp_path, 'add(recipe="fp32")\nadd(recipe="bf16")')
    path.write_text(
        path.read_text()
        + "\ndef analyze(results):\n"
        + "    from fp4lab import analysis\n"
        + "    return {'paired': analysis.paired_difference(results.runs, 'recipe=fp32')}\n"
    )
    out = tmp_path / "res"
    assert cli.main(["run", str(path), "--out", str(out), "--quiet", "--no-figures"]) == 0
    assert "paired (" in capsys.readouterr().out
    table = (out / "paired.csv").read_text().splitlines()
    assert table[0] == "cell,pairs,diff,diff_lo,diff_hi,diff_mcse,verdict" and len(table) == 3
    assert cli.main(["report", str(out)]) == 0  # the report shows the experiment's tables
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "<h3>paired.csv</h3>" in page and "recipe=bf16" in page.split("paired.csv")[1]
    # a failing analyze is an error exit, and the runs stay stored
    path.write_text(path.read_text() + "\ndef analyze(results):\n    return 3\n")
    assert cli.main(["run", str(path), "--out", str(out), "--quiet"]) == 1
    said = "analyze(results) returned int; it must return {name: DataFrame}"
    assert said in capsys.readouterr().err
    assert (out / "figures" / "loss_curves.png").is_file()  # the figures are still written
    assert len(store.load(out).runs) == 4


def test_corrupt_record_is_detected_and_redone(tmp_path):
    path = write_experiment(tmp_path, 'add(recipe="fp32")')
    exp = sweep.load_experiment(path)
    out = tmp_path / "res"
    sweep.run_experiment(exp, out, progress=False)
    files = sorted((out / "runs").glob("*.json"))
    keep = files[1].read_bytes()
    files[0].write_text(files[0].read_text()[:200])  # a partial file
    with pytest.warns(store.CorruptRecord):
        counts = sweep.run_experiment(exp, out, progress=False)
    assert counts["done"] == 1 and counts["skipped"] == 1
    assert files[1].read_bytes() == keep
    body = json.loads(files[1].read_text())
    body["summary"]["final_loss"] = 0.0  # an edited file fails its checksum
    files[1].write_text(json.dumps(body))
    with pytest.warns(store.CorruptRecord):
        assert store.Store(out).read(files[1].stem) is None


def test_a_failing_cell_is_recorded_and_the_sweep_goes_on(tmp_path):
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("a")  # readable, but too short to train on: the cell raises when it runs
    body = f'add(recipe="fp32")\nadd("text", task="text", text_path={str(tiny)!r})'
    exp = sweep.load_experiment(write_experiment(tmp_path, body))
    counts = sweep.run_experiment(exp, tmp_path / "res", progress=False)
    assert counts["done"] == 2 and counts["failed"] == 2
    res = store.load(tmp_path / "res")
    failed = res.runs[res.runs.status == "failed"]
    assert len(failed) == 2 and (failed.cell == "text").all()
    record = json.loads(store.Store(tmp_path / "res").file(failed.run_id.iloc[0]).read_text())
    assert "at least 2 characters" in record["error"]


def test_no_pickle_in_results(tmp_path):
    path = write_experiment(tmp_path, 'add(recipe="fp32", telemetry_every=1)', steps=2)
    exp = sweep.load_experiment(path)
    sweep.run_experiment(exp, tmp_path / "res", progress=False)
    files = [f for f in (tmp_path / "res").rglob("*") if f.is_file()]
    lock = tmp_path / "res" / LOCK_FILE  # the writer lock: one plain line naming its process
    assert lock.read_text().startswith("process ")
    files.remove(lock)
    # the index: an SQLite database (its WAL files while open), rebuilt from the run files
    index = [f for f in files if f.name.startswith(INDEX_FILE)]
    with contextlib.closing(sqlite3.connect(tmp_path / "res" / INDEX_FILE)) as db:
        assert db.execute("select count(*) from sqlite_master").fetchone()[0] > 0
    files = [f for f in files if f not in index]
    assert len(list((tmp_path / "res" / "runs").glob("*.json"))) == exp.n_runs  # all written
    assert {f.suffix for f in files} == {".json", ".parquet"}
    for f in files:  # everything else is JSON, or a run's metrics as Parquet
        if f.suffix == ".parquet":
            data = f.read_bytes()
            assert data[:4] == data[-4:] == b"PAR1"
        else:
            json.loads(f.read_text())


# ---------------------------------------------------------------------------------------------
# Kill and resume.


@pytest.mark.slow  # a subprocess
def test_sweep_killed_mid_run_resumes_with_every_run_once(tmp_path):
    # killed while it compiles the second cell (after the first cell's 2 records); the resume
    # computes that cell's 4 seeds in 2 calls: one compile here, not one per cell left
    body = 'add(recipe="fp32", lr=1e-3)\nadd(recipe="fp32", lr=2e-3, seeds=4)'
    path = write_experiment(tmp_path, body, steps=20)
    out = tmp_path / "res"
    env = os.environ | {"JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "fp4lab.cli", "run", str(path), "--out", str(out), "--quiet"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    runs = out / "runs"
    before = kill_after_records(proc, runs)
    exp = sweep.load_experiment(path)
    assert 2 <= len(before) < exp.n_runs, "the sweep must be killed mid-run"
    counts = sweep.run_experiment(exp, out, progress=False)
    assert counts["skipped"] == len(before) and counts["done"] == exp.n_runs - len(before)
    after = {f.name: f.read_bytes() for f in runs.glob("*.json")}
    ids = {f"{r}.json" for c in exp.cells for r in c.run_ids()}
    assert set(after) == ids  # every run exactly once, no strays
    assert all(after[name] == data for name, data in before.items())  # finished runs untouched
    assert not list(runs.glob(".*"))  # no temporary files left behind
    assert len(store.load(out).runs) == exp.n_runs
