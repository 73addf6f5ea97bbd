"""Results you can trust: one experiment per folder, current and stale runs never pooled, run ids
that cover data and numerics, provenance, per-batch records, bad entries skipped, file modes."""

import json
import os
import stat
import textwrap
import warnings
from pathlib import Path

import pytest
from fakes import fake_compute  # tests/fakes.py

from fp4lab import cli, sweep
from fp4lab.sweep import records, store
from fp4lab.train.config import Config

BASE = """
from fp4lab.train.config import Config

SEEDS = 2

def get_config():
    return Config(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,),
                  batch_size=32, steps={steps}, eval_batches=1, seed_batch=2, lr={lr})
"""


def write_experiment(tmp_path: Path, body: str, steps=3, lr=3e-3, name="exp") -> Path:
    path = tmp_path / f"{name}.py"
    sweep_fn = "\ndef sweep(add):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    path.write_text(BASE.format(steps=steps, lr=lr) + sweep_fn)
    return path


def run(path, out, **kw):
    return sweep.run_experiment(sweep.load_experiment(path), out, progress=False, **kw)


# ---------------------------------------------------------------------------------------------
# A folder belongs to one experiment.


def test_another_experiment_into_the_same_folder_is_an_error_unless_forced(tmp_path, capsys):
    a = write_experiment(tmp_path, 'add(recipe="fp32")', name="alpha")
    b = write_experiment(tmp_path, 'add(recipe="bf16")', name="beta")
    out = tmp_path / "res"
    run(a, out, compute=fake_compute)
    with pytest.raises(sweep.FolderTaken, match=r"'alpha' \(alpha.py\), not of 'beta' \(beta.py\)"):
        run(b, out, compute=fake_compute)
    assert cli.main(["run", str(b), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "fp4lab run: error:" in err and "--force" in err and "'alpha'" in err
    counts = run(b, out, compute=fake_compute, force=True)
    assert counts["done"] == 2
    res = store.load(out)
    assert set(res.runs["experiment"]) == {"beta"} and res.n_stale == 2  # alpha's runs stay


# ---------------------------------------------------------------------------------------------
# Current and stale runs.


def test_edited_config_runs_are_stale_never_pooled(tmp_path):
    out = tmp_path / "res"
    path = write_experiment(tmp_path, 'add("x", recipe="fp32")', lr=3e-3)
    run(path, out, compute=fake_compute)
    path = write_experiment(tmp_path, 'add("x", recipe="fp32")', lr=1e-2)  # lr edited
    counts = run(path, out, compute=fake_compute)
    assert counts["done"] == 2 and counts["skipped"] == 0
    current = store.load(out)
    assert len(current.runs) == 2 and (current.runs["lr"] == 1e-2).all()
    assert list(current.runs["cell"]) == ["x", "x"] and current.n_stale == 2
    old = store.load(out, stale=True)
    assert len(old.runs) == 2 and (old.runs["lr"] == 3e-3).all()
    assert old.runs["cell"].str.match(r"x \[stale [0-9a-f]{12}\]").all()
    assert not set(old.runs["run_id"]) & set(current.runs["run_id"])
    # other steps: a third config; the stale runs of the two old configs keep apart
    sweep.run_experiment(
        sweep.load_experiment(path, steps=5), out, progress=False, compute=fake_compute
    )
    stale = store.load(out, stale=True)
    assert len(stale.runs) == 4 and stale.runs.groupby("cell").size().tolist() == [2, 2]


def test_renamed_cell_shows_its_new_name_and_reruns_nothing(tmp_path):
    out = tmp_path / "res"
    run(write_experiment(tmp_path, 'add("old", recipe="fp32")'), out, compute=fake_compute)
    counts = run(write_experiment(tmp_path, 'add("new", recipe="fp32")'), out, compute=fake_compute)
    assert counts["skipped"] == 2 and counts["done"] == 0
    res = store.load(out)
    assert list(res.runs["cell"]) == ["new", "new"] and res.n_stale == 0


def test_cli_ls_counts_stale_and_show_stale_shows_them(tmp_path, capsys):
    out = tmp_path / "res"
    path = write_experiment(tmp_path, 'add("x", recipe="fp32")')
    assert cli.main(["run", str(path), "--out", str(out), "--quiet", "--no-figures"]) == 0
    args = ["run", str(path), "--out", str(out), "--quiet", "--no-figures", "--steps", "2"]
    assert cli.main(args) == 0
    capsys.readouterr()
    assert cli.main(["ls", str(out)]) == 0
    text = capsys.readouterr().out
    assert "x  " in text and "ok 2  failed 0  missing 0" in text and "stale: 2 runs" in text
    assert cli.main(["show", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2 stale runs not shown" in text
    table = text.split("intervals over seeds")[1]
    assert " x " in table and "stale" not in table.split("(2 stale")[0]
    assert cli.main(["show", str(out), "--stale"]) == 0
    assert "x [stale " in capsys.readouterr().out
    fresh = tmp_path / "fresh"
    assert cli.main(["run", str(path), "--out", str(fresh), "--quiet", "--no-figures"]) == 0
    capsys.readouterr()
    assert cli.main(["show", str(fresh), "--stale"]) == 0
    assert capsys.readouterr().out.endswith(": no stale runs (every run is one its experiment "
                                            "file asks for)\n")  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The run id covers data and numerics; records carry provenance.


def test_run_id_covers_the_data_file_and_the_numerics_version(tmp_path, monkeypatch):
    text = tmp_path / "t.txt"
    text.write_text("abcabcabd" * 20)
    body = f'add("t", task="text", text_path={str(text)!r}, seq_len=8, seeds=1)'
    path = write_experiment(tmp_path, body)
    out = tmp_path / "res"
    assert run(path, out, compute=fake_compute)["done"] == 1
    assert run(path, out, compute=fake_compute)["skipped"] == 1
    text.write_text("abcabcabe" * 20)  # same length, other content
    assert run(path, out, compute=fake_compute)["done"] == 1
    assert store.load(out).n_stale == 1
    monkeypatch.setattr(store, "NUMERICS_VERSION", store.NUMERICS_VERSION + 1)
    assert run(path, out, compute=fake_compute)["done"] == 1  # a numerics bump redoes it
    (rid,) = store.load(out).runs["run_id"]
    record = store.Store(out).read(rid)
    assert record["numerics"] == store.NUMERICS_VERSION == record["provenance"]["numerics"]
    sha = record["data"]["text_path"]
    assert len(sha) == 64 and sha in record["data"].values()
    prov = record["provenance"]
    assert prov["versions"]["fp4lab"] and prov["versions"]["jaxlib"] and prov["versions"]["flax"]
    assert prov["device"] and "git_revision" in prov
    assert prov["cpu"] == store.cpu() and store.load(out).provenance["cpu"].iloc[0] == prov["cpu"]
    text.unlink()
    with pytest.raises(sweep.ExperimentError, match=r"exp.py:\d+: cell .*t.txt.*cannot read"):
        sweep.load_experiment(path)


def test_a_record_names_the_cpu_that_computed_it_not_the_drivers(tmp_path):
    def on_a_worker(config, seeds):  # as compute_cell on another host (a Ray worker)
        return [r | {"cpu": "Worker CPU [avx2]"} for r in fake_compute(config, seeds)]

    out = tmp_path / "res"
    assert run(write_experiment(tmp_path, 'add("x", seeds=1)'), out, compute=on_a_worker)["done"]
    (record,) = store.Store(out).records()
    assert record["provenance"]["cpu"] == "Worker CPU [avx2]" and "cpu" not in record


def restamp(out: Path, code: str) -> None:
    """Rewrites every record of `out` as if fp4lab `code` had made it."""
    st = store.Store(out)
    for r in st.records():
        r.pop("schema")
        r["provenance"]["versions"]["fp4lab"] = code
        st.write(r)


def test_show_warns_on_mixed_code_and_rerun_stale_recomputes(tmp_path, capsys):
    out = tmp_path / "res"
    path = write_experiment(tmp_path, 'add("x", recipe="fp32")')
    run(path, out, compute=fake_compute)
    restamp(out, "0.0.1")
    write_experiment(tmp_path, 'add("x", recipe="fp32")\nadd("y", recipe="bf16")')
    run(path, out, compute=fake_compute)  # y by this code, x by "0.0.1"
    assert cli.main(["show", str(out)]) == 0
    err = capsys.readouterr().err
    assert "mixes code versions" in err and "2 runs by fp4lab 0.0.1" in err
    assert "--rerun-stale" in err
    counts = run(path, out, compute=fake_compute, rerun_stale=True)
    assert counts["done"] == 2 and counts["skipped"] == 2  # x redone, y kept
    assert cli.main(["show", str(out)]) == 0
    assert "mixes code versions" not in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Records per finished seed batch.


def test_records_are_written_per_seed_batch(tmp_path):
    out = tmp_path / "res"
    path = write_experiment(tmp_path, 'add("x", recipe="fp32", seeds=6)')  # seed_batch 2
    seen = []

    def compute(config, seeds):
        seen.append((len(seeds), len(list((out / "runs").glob("*.json")))))
        if len(seen) == 3:
            raise KeyboardInterrupt  # killed while the third batch runs
        return fake_compute(config, seeds)

    with pytest.raises(KeyboardInterrupt):
        run(path, out, compute=compute)
    assert seen == [(2, 0), (2, 2), (2, 4)]  # each batch's records on disk before the next
    counts = run(path, out, compute=fake_compute)
    assert counts["skipped"] == 4 and counts["done"] == 2


@pytest.mark.parametrize(
    "seeds, pad, widths",
    [
        (9, False, [3, 3, 3]),  # --design streams' 9 at seed_batch 4: one program, not 4 and 1
        (8, False, [4, 4]),
        (5, False, [1] * 5),  # a prime: calls of one seed, still one program
        (3, False, [3]),
        (9, True, [4, 4, 1]),  # vmapped: every call 4 wide, the last padded
    ],
)
def test_a_cells_seeds_are_cut_so_that_it_compiles_once(seeds, pad, widths, monkeypatch):
    from fp4lab.sweep import compute, experiment, runner
    from fp4lab.train.config import Config

    monkeypatch.setattr(compute.jax, "default_backend", lambda: "cpu")  # sequential calls

    cfg = Config(seed_batch=4, pad_seeds=pad)
    cell = experiment.Cell(
        label="c", overrides={}, config=cfg, seeds=[(i,) * 3 for i in range(seeds)]
    )
    work = runner.batches([(cell, list(cell.seeds), [str(i) for i in range(seeds)])])
    assert [len(s) for _, s, _ in work] == widths
    assert [i for _, _, ids in work for i in ids] == [str(i) for i in range(seeds)]
    assert len({compute.call_width(cfg, len(s)) for _, s, _ in work}) == 1


# ---------------------------------------------------------------------------------------------
# Bad entries: one warning naming the file, the rest loads.


@pytest.mark.parametrize("bad", ["no_status", "manifest", "folder", "not_a_dict"])
def test_a_bad_entry_is_skipped_with_one_warning(tmp_path, capsys, bad):
    out = tmp_path / "res"
    path = write_experiment(tmp_path, 'add("x", recipe="fp32")')
    run(path, out, compute=fake_compute)
    st = store.Store(out)
    first = sorted((out / "runs").glob("*.json"))[0]
    if bad == "no_status":  # a valid checksum, but no status
        body = json.loads(first.read_text())
        del body["status"], body["checksum"], body["schema"]
        first.write_text(records.seal(body)[1])
        culprit, what = first, "field 'status'=None"
    elif bad == "manifest":
        culprit = out / "experiment.json"
        culprit.write_text(culprit.read_text()[:30])
        what = "bad experiment manifest"
    elif bad == "folder":
        culprit = out / "runs" / "x.json"
        culprit.mkdir()
        what = "not a regular file"
    else:
        culprit, what = first, "holds a list"
        first.write_text("[1, 2]")
    with pytest.warns(store.CorruptRecord) as caught:
        res = store.load(out)
        store.load(out)
        assert cli.main(["ls", str(out)]) == 0
        assert cli.main(["show", str(out)]) == 0
    mine = [w for w in caught if str(culprit) in str(w.message)]
    assert len(mine) == 1 and what in str(mine[0].message)
    assert len(res.runs) == (1 if bad in ("no_status", "not_a_dict") else 2)
    with warnings.catch_warnings(record=True):  # already reported above: at most once more
        counts = run(path, out, compute=fake_compute)
        assert counts["done"] + counts["skipped"] == 2
        assert len(st.records()) == 2 and len(store.load(out).runs) == 2


def test_load_of_a_file_or_missing_folder_is_a_clear_error(tmp_path):
    (tmp_path / "f.json").write_text("{}")
    with pytest.raises(store.StoreError, match=r"f.json is a file; load a results folder"):
        store.load(tmp_path / "f.json")
    with pytest.raises(FileNotFoundError, match="no results folder"):
        store.load(tmp_path / "nope")


# ---------------------------------------------------------------------------------------------
# Files and their errors.


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_files_are_0666_minus_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        run(write_experiment(tmp_path, 'add("x")'), tmp_path / "res", compute=fake_compute)
    finally:
        os.umask(old)
    files = [f for f in (tmp_path / "res").rglob("*") if f.is_file()]
    # experiment.json, the writer's lock file, the index, and for each of the 2 runs its record
    # and its metrics (Parquet)
    assert len(files) == 7 and {stat.S_IMODE(f.stat().st_mode) for f in files} == {mode}


@pytest.mark.parametrize("errno_, message", [(28, "no space left"), (30, "Read-only file system")])
def test_a_write_that_fails_is_one_clear_error(tmp_path, monkeypatch, capsys, errno_, message):
    path = write_experiment(tmp_path, 'add("x")')

    def fail(*args, **kwargs):
        raise OSError(errno_, os.strerror(errno_))

    monkeypatch.setattr(records.tempfile, "mkstemp", fail)
    with pytest.raises(store.StoreError, match=f"experiment.json: cannot write .*{message}"):
        run(path, tmp_path / "res", compute=fake_compute)
    assert cli.main(["run", str(path), "--out", str(tmp_path / "res"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "experiment.json" in err[0]


def test_without_a_manifest_ls_and_load_keep_configs_apart(tmp_path, capsys):
    out = tmp_path / "res"
    run(write_experiment(tmp_path, 'add("x")', lr=3e-3), out, compute=fake_compute)
    run(write_experiment(tmp_path, 'add("x")', lr=1e-2), out, compute=fake_compute)
    (out / "experiment.json").write_text("{")
    with pytest.warns(store.CorruptRecord, match="experiment.json: bad experiment manifest"):
        assert cli.main(["ls", str(out)]) == 0
        res = store.load(out)
    text = capsys.readouterr().out
    assert text.count("ok 2  failed 0  missing 0") == 2 and "ok 4" not in text
    assert res.runs.groupby("cell").size().tolist() == [2, 2]


def test_a_field_added_at_its_old_default_keeps_the_stored_run_ids():
    # pad_seeds at the value the runs before it were computed with (its default, False, makes
    # other programs and so other ids: test_seed_width)
    new = Config(task="teacher", pad_seeds=True).to_dict()
    old = {k: v for k, v in new.items() if k not in store.ID_DEFAULTS}  # stored before them
    assert store.run_id(new, (0, 0, 0)) == store.run_id(old, (0, 0, 0))
    for field, default in store.ID_DEFAULTS.items():
        if field in store.INERT:  # decides nothing here (telemetry is off)
            continue
        assert new[field] == default
        changed = new | {field: not default if isinstance(default, bool) else None}
        assert store.run_id(changed, (0, 0, 0)) != store.run_id(new, (0, 0, 0))


def test_the_statistics_method_enters_run_ids_only_where_it_decides_numbers():
    off = Config(task="teacher").to_dict()
    assert off["telemetry_stats"] == "fused"  # the default, left out without telemetry
    legacy = {k: v for k, v in off.items() if k != "telemetry_stats"}
    for method in ("fused", "reference"):
        assert store.run_id(off | {"telemetry_stats": method}, (0, 0, 0)) == store.run_id(
            legacy, (0, 0, 0)
        )
    on = Config(task="teacher", telemetry_every=5).to_dict()
    before = {k: v for k, v in on.items() if k != "telemetry_stats"}  # a record made before it
    reference = on | {"telemetry_stats": "reference"}
    assert store.run_id(reference, (0, 0, 0)) == store.run_id(before, (0, 0, 0))
    assert store.run_id(on, (0, 0, 0)) != store.run_id(reference, (0, 0, 0))
    # an older record's config is read with the method it was made with
    assert Config.from_dict(before).telemetry_stats == "reference"
    assert Config.from_dict(on).telemetry_stats == "fused"
