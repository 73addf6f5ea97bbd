"""The summary index and compaction: the index rebuilt from the files equals the live one, a
compacted folder loads as before and resumes, filters read only what they name."""

import subprocess
import sys
import warnings

import pandas as pd
import pytest
from fakes import fake_compute  # tests/fakes.py
from test_store import run, write_experiment  # tests/sweep/test_store.py

from fp4lab import cli, sweep
from fp4lab.sweep import compact, index, store

CELLS = 'add("a", recipe="fp32")\nadd("b", recipe="bf16")'


def tables(out, **kw):
    """(runs, metrics) of a folder, in an order that does not depend on the layout."""
    res = store.load(out, **kw)
    runs = res.runs.sort_values("run_id").reset_index(drop=True)
    metrics = res.metrics.sort_values(["run_id", "metric", "step"]).reset_index(drop=True)
    return runs, metrics


def assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        pd.testing.assert_frame_equal(x, y)


def test_the_index_rebuilt_from_the_files_equals_the_live_one(tmp_path):
    out = tmp_path / "res"
    path = write_experiment(tmp_path, CELLS)
    run(path, out, compute=fake_compute)
    compact.compact(out)
    sweep.run_experiment(
        sweep.load_experiment(path, seeds=4), out, progress=False, compute=fake_compute
    )  # two more seeds per cell, in runs/ again
    (out / "runs" / "0000000000000000.json").write_text("{}")  # a bad entry: no row
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        live = store.Store(out).index().dump()
        for f in out.glob(f"{index.INDEX_FILE}*"):
            f.unlink()
        rebuilt = store.Store(out).index().dump()
    assert rebuilt == live
    assert len(live["runs"]) == 8 and len(live["parts"]) == 1
    assert {r[14] for r in live["runs"]} == {"runs", "compact/records-0001.parquet"}  # source


def test_a_compacted_folder_loads_as_before_and_resumes(tmp_path):
    out = tmp_path / "res"
    path = write_experiment(tmp_path, CELLS)
    run(path, out, compute=fake_compute)
    before = tables(out)
    assert compact.compact(out) == {"runs": 4, "part": 1}
    assert not list((out / "runs").iterdir())  # the per-run files are gone
    assert_same(tables(out), before)
    assert store.Store(out).read(before[0]["run_id"][0])["series"]["loss"]  # a full record
    counts = sweep.run_experiment(
        sweep.load_experiment(path, seeds=3), out, progress=False, compute=fake_compute
    )
    assert (counts["done"], counts["skipped"]) == (2, 4)  # the compacted runs are not redone
    runs, metrics = tables(out)
    assert len(runs) == 6 and set(metrics["run_id"]) == set(runs["run_id"])
    assert compact.compact(out) == {"runs": 2, "part": 2}
    assert_same(tables(out), (runs, metrics))


def test_load_reads_only_the_cells_seeds_and_metrics_asked_for(tmp_path):
    out = tmp_path / "res"
    run(write_experiment(tmp_path, CELLS), out, compute=fake_compute)
    compact.compact(out)
    res = store.load(out, metrics="loss", cells=["b"], seeds={"init": [1]})
    assert list(res.runs["cell"]) == ["b"] and list(res.runs["seed_init"]) == [1]
    assert set(res.metrics["metric"]) == {"loss"}
    assert set(res.metrics["run_id"]) == set(res.runs["run_id"]) and len(res.metrics) == 3
    none = store.load(out, metrics=False)
    assert len(none.runs) == 4 and none.metrics.empty
    with pytest.raises(ValueError, match=r"^load: no cell 'c'; cells: a, b$"):
        store.load(out, cells=["c"])
    with pytest.raises(ValueError, match=r"^load: seeds has 'init_seed'; streams: init, data"):
        store.load(out, seeds={"init_seed": [0]})


def test_ls_and_compact_on_the_command_line(tmp_path, capsys):
    out = tmp_path / "res"
    run(write_experiment(tmp_path, CELLS), out, compute=fake_compute)
    assert cli.main(["compact", str(out)]) == 0
    assert "4 runs compacted into part 1" in capsys.readouterr().out
    assert cli.main(["ls", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "a " in shown and shown.count("ok 2  failed 0  missing 0") == 2
    assert cli.main(["compact", str(out)]) == 0
    assert "0 runs compacted" in capsys.readouterr().out
    assert cli.main(["compact", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.startswith("fp4lab compact: error: no results folder at")


def test_a_read_only_folder_is_indexed_in_memory(tmp_path, monkeypatch):
    out = tmp_path / "res"
    run(write_experiment(tmp_path, CELLS), out, compute=fake_compute)
    for f in out.glob(f"{index.INDEX_FILE}*"):
        f.unlink()
    monkeypatch.setattr(index.os, "access", lambda path, mode: False)  # as for a non-root user
    assert len(store.load(out).runs) == 4
    assert not (out / index.INDEX_FILE).exists()


def test_an_edited_part_is_reported_its_records_serve_and_its_runs_are_redone(tmp_path):
    out = tmp_path / "res"
    path = write_experiment(tmp_path, CELLS)
    run(path, out, compute=fake_compute)
    compact.compact(out)
    metrics = out / "compact" / "metrics-0001.parquet"
    metrics.write_bytes(metrics.read_bytes()[:-100] + bytes(100))
    for f in out.glob(f"{index.INDEX_FILE}*"):
        f.unlink()
    with pytest.warns(sweep.CorruptRecord, match="metrics-0001.parquet is not the one"):
        res = store.load(out)
    assert len(res.runs) == 4 and set(res.metrics["metric"]) == {"eval_loss"}  # the records'
    assert run(path, out, compute=fake_compute)["done"] == 4


def test_ls_and_show_as_a_fresh_process_load_no_jax(tmp_path):
    """Reading a results folder loads neither jax nor the trainer (`import fp4lab.sweep` is
    lazy, the CLI names `run`'s errors only from the modules loaded)."""
    out = tmp_path / "res"
    run(write_experiment(tmp_path, CELLS), out, compute=fake_compute)
    code = (
        "import sys; from fp4lab import cli; codes = [cli.main(c.split()) for c in sys.argv[1:]]; "
    )
    code += "print(codes, sorted(m for m in ('jax', 'flax', 'optax') if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code, f"ls {out}", f"show {out}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.splitlines()[-1] == "[0, 0] []"
    assert "ok 2  failed 0  missing 0" in done.stdout
