"""`fl.replicate` / `fp4lab replicate`: a finished study's cells on fresh seeds, its words on
the fresh and the pooled seeds beside the committed ones; resumable (also after kill -9),
refusing seeds the study used."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
from fakes import fake_compute, kill_after_records  # tests/fakes.py

import fp4lab as fl
from fp4lab import cli
from fp4lab.sweep import experiment, runner

STUDY = """
from fp4lab import analysis
from fp4lab.train.config import Config

SEEDS = 4


def get_config():
    return Config(task="markov", vocab=16, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                  seq_len=8, batch_size=4, steps=STEPS, lr=3e-3, warmup=0, eval_batches=1,
                  seed_batch=1)


def sweep(add):
    add(recipe="bf16")
    add(recipe="nvfp4")


def analyze(results):
    v = analysis.verdict(results.runs, "loss_gap", baseline="recipe=bf16")
    return {"paired": analysis.fixed_rows(v)}
"""


def study(folder, steps=3):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "study.py"
    path.write_text(textwrap.dedent(STUDY).replace("STEPS", str(steps)))
    return path


def planted(config, seeds):
    """fake_compute with NVFP4 0.5 above BF16 and a seed-to-seed spread."""
    out = fake_compute(config, seeds)
    for row, s in zip(out, seeds, strict=True):
        gap = 0.5 * (config["recipe"] == "nvfp4") + 0.05 * ((7 * sum(s)) % 5)
        row["summary"] |= {"loss_gap": gap, "final_loss": gap}
    return out


def committed(tmp_path, compute=planted):
    path = study(tmp_path / "exp")
    folder = tmp_path / "results" / "study"
    exp = experiment.load_experiment(path)
    runner.run_experiment(exp, folder, compute=compute, progress=False)
    for name, table in exp.analyze(fl.load(folder)).items():  # as `fp4lab run` writes them
        table.to_csv(folder / f"{name}.csv", index=False, float_format="%.5g")
    return folder


def test_words_on_fresh_and_pooled_seeds_and_a_rerun_computes_nothing(tmp_path):
    folder = committed(tmp_path)
    words = fl.replicate(folder, 4, compute=planted, progress=False)
    assert list(words.columns) == ["table", "row", "committed", "fresh", "pooled", "replication"]
    row = words.set_index("row").loc["recipe=nvfp4 - recipe=bf16"]
    assert (row["committed"], row["fresh"], row["pooled"]) == ("higher",) * 3
    assert row["replication"] == "replicated"
    out = tmp_path / "results" / "study_fresh4"
    fresh = fl.load(out).runs
    assert sorted(set(fresh["seed_init"])) == [4, 5, 6, 7] and len(fresh) == 8
    assert (fresh["seed_init"] == fresh["seed_quant"]).all()  # the design kept: (i, i, i)
    assert pd.read_csv(out / "words.csv").equals(words)
    assert (out / "paired.csv").is_file() and (out / "pooled" / "paired.csv").is_file()
    pooled = pd.read_csv(out / "pooled" / "paired.csv")
    assert pooled["family"].iloc[0] == 3  # 1 contrast + 2 cells' seed rows, 8 seeds each
    calls = []
    again = fl.replicate(folder, 4, compute=lambda c, s: calls.append(s) or planted(c, s))
    assert calls == [] and again.equals(words)  # finished runs are never recomputed


THINNED = """
from pathlib import Path

import pandas as pd

from fp4lab import analysis


def analyze(results):
    # as a thinned study does: runs whose telemetry was dropped (here the committed seeds 0-3)
    # read the value their study saved beside them
    runs = results.runs
    old = runs["seed_init"] < 4
    if old.any():
        saved = pd.read_csv(Path(results.path) / "saved.csv", index_col="run_id")["gap"]
        runs = runs.assign(loss_gap=runs["loss_gap"].where(~old, runs["run_id"].map(saved)))
    v = analysis.verdict(runs, "loss_gap", baseline="recipe=bf16")
    return {"paired": analysis.fixed_rows(v)}
"""


def test_the_pooled_runs_read_what_a_thinned_study_saved_beside_its_runs(tmp_path):
    folder = committed(tmp_path)
    path = folder.parent.parent / "exp" / "study.py"
    head, _ = path.read_text().split("def analyze")
    path.write_text(head + textwrap.dedent(THINNED))
    runs = fl.load(folder).runs
    # the saved values: the records' gaps, NVFP4's lowered by 1 (the pooled word then flips)
    gap = runs["loss_gap"] - 1.0 * (runs["recipe"] == "nvfp4")
    pd.DataFrame(dict(run_id=runs["run_id"], gap=gap)).to_csv(folder / "saved.csv", index=False)
    words = fl.replicate(folder, 4, compute=planted, progress=False)
    row = words.set_index("row").loc["recipe=nvfp4 - recipe=bf16"]
    assert (row["fresh"], row["pooled"]) == ("higher", "no evidence")


def test_a_stream_a_cell_holds_at_one_seed_is_one_level_pooled():
    # BF16 draws nothing from the quant stream: its one quant seed, moved from 0 to 10 only to
    # clear the used seeds, is the committed one pooled; varied streams keep their fresh seeds
    committed = pd.DataFrame(
        dict(cell=["bf16"] * 2 + ["sr"] * 2, seed_init=[0, 1] * 2, seed_data=[0, 1] * 2)
        | dict(seed_quant=[0, 0, 0, 1])
    )
    fresh = committed.assign(**{c: committed[c] + 10 for c in committed.columns[1:]})
    kept = fl.sweep.fresh.one_level_kept(committed, fresh)
    assert kept["seed_quant"].tolist() == [0, 0, 10, 11]
    assert kept["seed_init"].tolist() == [10, 11, 10, 11]
    assert fresh["seed_quant"].tolist() == [10, 10, 10, 11]  # the input is left alone


def test_seeds_the_study_used_are_refused(tmp_path):
    folder = committed(tmp_path)
    for start in (1, 3):
        with pytest.raises(experiment.ExperimentError, match="that the committed runs used"):
            fl.replicate(folder, start, compute=planted, progress=False)
    assert not (tmp_path / "results" / "study_fresh3").exists()


def test_a_word_that_fresh_seeds_do_not_give_is_not_replicated():
    committed = {"t": pd.DataFrame(dict(term=["a", "b", "c"], verdict=["higher"] * 3))}
    fresh = {
        "t": pd.DataFrame(
            dict(term=["a", "b", "c"], verdict=["higher", "no evidence"] * 1 + ["lower"])
        )
    }
    pooled = {
        "t": pd.DataFrame(dict(term=["a", "b", "c"], verdict=["higher", "higher", "no evidence"]))
    }
    words = fl.analysis.replication.compare_words(committed, fresh, pooled)
    assert words["replication"].tolist() == ["replicated", "only pooled", "not replicated"]


def test_rows_of_one_cell_per_outcome_are_read_apart_and_unnamed_twins_are_refused():
    # stream_attribution: one row per (cell, outcome), both worded
    outcomes = dict(cell=["x", "x"], outcome=["spiked", "first_spike"])
    committed = {"a": pd.DataFrame(outcomes | dict(verdict=["matters", "no evidence"]))}
    fresh = {"a": pd.DataFrame(outcomes | dict(verdict=["matters", "matters"]))}
    words = fl.analysis.replication.compare_words(committed, fresh, fresh)
    assert words["row"].tolist() == ["x | spiked", "x | first_spike"]
    assert words["replication"].tolist() == ["replicated", "not replicated"]
    twins = pd.DataFrame(dict(cell=["x", "x"], verdict=["higher", "lower"]))
    with pytest.raises(ValueError, match=r"rows \['x'\] appear more than once"):
        fl.analysis.replication.row_words(twins)


@pytest.mark.slow  # subprocesses that train
def test_the_command_resumes_after_kill_9_and_refuses_used_seeds(tmp_path, capsys):
    path = study(tmp_path / "exp", steps=3)
    folder = tmp_path / "results" / "study"
    env = os.environ | {"JAX_PLATFORMS": "cpu"}
    run = ["run", str(path), "--out", str(folder), "--quiet", "--no-figures"]
    assert cli.main(run) == 0
    argv = ["replicate", str(folder), "--seeds-from", "4", "--quiet"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "fp4lab.cli", *argv], env=env, stderr=subprocess.PIPE
    )
    out = tmp_path / "results" / "study_fresh4"
    before = kill_after_records(proc, out / "runs")
    assert 2 <= len(before) < 8, "the replication must be killed mid-run"
    capsys.readouterr()
    assert cli.main(argv) == 0
    shown = capsys.readouterr().out
    assert "recipe=nvfp4 - recipe=bf16" in shown and "replicat" in shown
    after = {f.name: f.read_bytes() for f in (out / "runs").glob("*.json")}
    assert len(after) == 8 and all(after[n] == data for n, data in before.items())
    assert pd.read_csv(out / "words.csv")["committed"].notna().all()
    assert cli.main(["replicate", str(folder), "--seeds-from", "2", "--quiet"]) == 2
    assert "that the committed runs used" in capsys.readouterr().err


def test_an_out_that_is_the_study_inside_it_or_another_folder_is_refused(tmp_path):
    folder = committed(tmp_path)

    def files():  # the study's files, less SQLite's shared-memory and log files (reads touch them)
        kept = (
            p for p in folder.iterdir() if p.is_file() and not p.name.endswith(("-shm", "-wal"))
        )
        return {p.name: p.read_bytes() for p in kept}

    before = files()
    other = tmp_path / "other"
    runner.run_experiment(experiment.load_experiment(study(tmp_path / "b")), other,
                          compute=planted, progress=False)  # fmt: skip
    elsewhere = fl.replicate(folder, 8, compute=planted, progress=False, out=tmp_path / "f8")
    cases = [
        (folder, "the study's own folder; "),
        (folder / "fresh", "the study's own folder or inside it"),
        (other, "holds other results (study), not this replication's"),  # same name, other runs
        (tmp_path / "f8", "holds other results (study), not this replication's"),  # seeds 8-11
    ]
    for out, said in cases:
        with pytest.raises(
            experiment.ExperimentError,
            match=r"^--out .*" + re.escape(said),
        ):
            fl.replicate(folder, 4, compute=planted, progress=False, out=out)
    assert files() == before
    assert not (folder / "fresh").exists() and len(elsewhere)
    fl.replicate(folder, 8, compute=planted, progress=False, out=tmp_path / "f8")  # resumes


def test_replicate_from_any_working_folder_and_from_dot(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = study(tmp_path / "exp")
    runner.run_experiment(experiment.load_experiment(path), tmp_path / "results" / "study",
                          compute=planted, progress=False)  # fmt: skip
    folder = tmp_path / "results" / "study"
    manifest = fl.load(folder).experiment
    assert manifest["path"] == "exp/study.py" and manifest["from_folder"] == "../../exp/study.py"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    words = fl.replicate(folder, 4, compute=planted, progress=False)
    monkeypatch.chdir(folder)
    assert fl.replicate(".", 4, compute=planted, progress=False).equals(words)  # "." resolved
    assert (tmp_path / "results" / "study_fresh4" / "words.csv").is_file()
    # a manifest written before from_folder: the recorded path from a folder above the study
    manifest.pop("from_folder")
    (folder / "experiment.json").write_text(json.dumps(manifest))
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert fl.replicate(folder, 4, compute=planted, progress=False).equals(words)


def test_replicate_says_what_is_wrong_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for folder in (tmp_path / "empty", tmp_path):
        assert cli.main(["replicate", str(folder), "--seeds-from", "4"]) == 2
        err = capsys.readouterr().err
        assert (
            err == f"fp4lab replicate: error: {folder}: not a results folder (no experiment.json)\n"
        )
    folder = committed(tmp_path)
    path = tmp_path / "exp" / "study.py"
    path.write_text(path.read_text().replace("SEEDS = 4", "SEEDS = 3"))
    with pytest.raises(experiment.ExperimentError) as e:
        fl.replicate(folder, 4, compute=planted, progress=False)
    assert str(e.value) == (
        f"{path} no longer asks for 2 of the 8 committed runs (cells recipe=bf16, recipe=nvfp4): "
        "a replication of a subset; restore the file's cells and seeds"
    )
    path.write_text(path.read_text().replace("SEEDS = 3", "SEEDS = 4").replace(
        '    add(recipe="nvfp4")\n', ""))  # fmt: skip
    with pytest.raises(experiment.ExperimentError, match=r"no longer asks for 4 of the 8 .*"
                       r"\(cells recipe=nvfp4\)"):  # fmt: skip
        fl.replicate(folder, 4, compute=planted, progress=False)
    path.unlink()
    with pytest.raises(experiment.ExperimentError, match="give --experiment FILE$"):
        fl.replicate(folder, 4, compute=planted, progress=False)


def test_a_manifest_that_cannot_be_read_is_said_as_such(tmp_path):
    folder = committed(tmp_path)
    manifest = folder / "experiment.json"
    manifest.write_text(manifest.read_text()[:40])  # truncated
    with (
        pytest.warns(UserWarning, match="bad experiment manifest"),
        pytest.raises(experiment.ExperimentError, match="its experiment.json cannot be read"),
    ):
        fl.replicate(folder, 4, compute=planted, progress=False)


def test_an_analyze_that_raises_or_returns_no_tables_is_one_line(tmp_path, capsys):
    folder = committed(tmp_path)
    path = tmp_path / "exp" / "study.py"
    source = path.read_text()
    for body, said in (
        ("raise ValueError('my analyze broke')",
         "analyze(results) of the fresh runs raised ValueError: my analyze broke"),
        ("return {'x': 5}", "analyze(results) of the fresh runs returned 'x': int; it must "
         "return {name: DataFrame}, names usable as file names"),
    ):  # fmt: skip
        path.write_text(source + f"\n\ndef analyze(results):\n    {body}\n")
        with pytest.raises(experiment.ExperimentError) as e:
            fl.replicate(folder, 4, compute=planted, progress=False)
        assert str(e.value) == f"{path}: {said}"
    assert len(fl.load(folder.with_name("study_fresh4"), metrics=False).runs) == 8  # stored


@pytest.mark.parametrize("command", ["replicate", "diagnose"])
def test_sigterm_stops_replicate_and_diagnose_with_one_line(tmp_path, monkeypatch, capsys, command):
    import signal
    import time

    import fp4lab.diagnosis
    from fp4lab.sweep import fresh

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        raise AssertionError("SIGTERM did not stop it")

    monkeypatch.setattr(fresh, "replicate", terminated)
    monkeypatch.setattr(fp4lab.diagnosis, "diagnose", terminated)
    argv = {
        "replicate": ["replicate", str(tmp_path), "--seeds-from", "4"],
        "diagnose": ["diagnose", str(tmp_path / "e.py"), "--out", str(tmp_path / "d")],
    }
    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or a test runner's (xdist's) own
    assert cli.main(argv[command]) == 130
    err = capsys.readouterr().err
    resume = "; finished runs are stored, run again to resume" if command == "replicate" else ""
    assert err.strip().splitlines() == [f"fp4lab {command}: interrupted{resume}"]
    assert signal.getsignal(signal.SIGTERM) is before  # restored
