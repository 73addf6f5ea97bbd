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
    with pytest.warns(UserWarning, match=r"'attn_logit_max' \(a series these runs' configs or"):
        store.load(out, metrics=["attn_logit_max"])  # a known series, not recorded here
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


def test_a_folder_named_as_the_index_is_one_warning_in_ls_show_and_run(tmp_path, capsys):
    out = tmp_path / "res"
    path = write_experiment(tmp_path, CELLS)
    run(path, out, compute=fake_compute)
    for f in out.glob(f"{index.INDEX_FILE}*"):
        f.unlink()
    (out / index.INDEX_FILE).mkdir()
    said = (
        f"{out / index.INDEX_FILE} is a folder (not the index's file; move it away to keep an "
        "index); this process keeps the index in memory, built from the run files"
    )
    for command in (["ls", str(out)], ["show", str(out)]):
        with pytest.warns(sweep.CorruptRecord) as caught:
            assert cli.main(command) == 0, command
        assert [str(w.message) for w in caught] == [said]
        assert "ok 2" in capsys.readouterr().out or command[0] == "show"
    with pytest.warns(sweep.CorruptRecord, match="is a folder"):
        counts = run(path, out, compute=fake_compute)
        assert counts["skipped"] == 4 and len(store.load(out).runs) == 4


def _compacted(tmp_path, name):
    out = tmp_path / name
    (tmp_path / f"{name}-exp").mkdir()
    run(write_experiment(tmp_path / f"{name}-exp", CELLS), out, compute=fake_compute)
    compact.compact(out)
    return out


def test_a_missing_metrics_part_gives_no_metrics_with_a_warning_not_an_arrow_error(tmp_path):
    out = _compacted(tmp_path, "m")
    (out / "compact" / "metrics-0001.parquet").unlink()
    with pytest.warns(sweep.CorruptRecord, match="metrics-0001.parquet cannot be read"):
        res = store.load(out, metrics=["loss"])
    assert len(res.runs) == 4 and res.metrics.empty
    assert list(res.metrics.columns) == ["run_id", "step", "metric", "value"]


def test_a_missing_records_part_is_warned_in_every_reader(tmp_path, capsys):
    out = _compacted(tmp_path, "r")
    (out / "compact" / "records-0001.parquet").unlink()
    said = (
        f"{out / 'compact' / 'metrics-0001.parquet'}: its records part records-0001.parquet is "
        "missing: the 4 runs it held are lost (restore the file, or run the experiment again "
        "to compute them)"
    )
    script = (
        "import sys, warnings; warnings.simplefilter('always'); from fp4lab import cli; "
        "sys.exit(cli.main(sys.argv[1:]))"
    )
    for command in ("ls", "show"):  # each a fresh process, as a user runs them
        done = subprocess.run(
            [sys.executable, "-c", script, command, str(out)], capture_output=True, text=True
        )
        assert done.returncode == 0 and f"warning: {said}" in done.stderr.splitlines(), command
    with pytest.warns(sweep.CorruptRecord) as caught:
        assert store.load(out).runs.empty
    assert said in [str(w.message) for w in caught]


def test_a_corrupt_records_part_still_gives_the_runs_tables_columns(tmp_path):
    out = _compacted(tmp_path, "c")
    part = out / "compact" / "records-0001.parquet"
    part.write_bytes(part.read_bytes()[:100] + b"x" * 50)
    with pytest.warns(sweep.CorruptRecord, match="records-0001.parquet cannot be read"):
        runs = store.load(out).runs
    assert runs.empty and {"run_id", "cell", "status", "final_loss", "learned"} <= set(runs)


def test_a_metric_no_run_has_is_warned_with_the_nearest_name(tmp_path):
    out = _compacted(tmp_path, "n")
    said = r"no run here has the metric 'losss'; did you mean 'loss'"
    with pytest.warns(UserWarning, match=said):
        res = store.load(out, metrics=["losss", "loss"])
    assert set(res.metrics["metric"]) == {"loss"}
    with pytest.warns(UserWarning, match=r"'attn_logit_max' \(a series these runs' configs or"):
        store.load(out, metrics=["attn_logit_max"])  # a known series, not recorded here
