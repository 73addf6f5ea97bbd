"""A printed number is computed from intact run files or the command says which files are
damaged: a flipped byte of the index never changes an answer (the index is rebuilt), an index
that cannot be decoded or written is one warning line, a damaged compacted part is named by
every reader every time (its runs count as damaged, its records still serve), and random byte
flips of the index and of each part file are each detected or harmless."""

import random
import shutil
import sqlite3
import textwrap
import warnings

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fakes import fake_compute  # tests/fakes.py

from fp4lab import cli, sweep
from fp4lab.sweep import compact, index, records, store

EXPERIMENT = """
from fp4lab.train.config import Config

def get_config():
    return Config(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,),
                  batch_size=32, steps=3, eval_batches=1, seed_batch=2)

def sweep(add):
    add("a", recipe="fp32", seeds={seeds})
    add("b", recipe="bf16", seeds={seeds})
"""


def _sweep(folder, seeds: int) -> None:
    path = folder.parent / f"{folder.name}.py"
    path.write_text(textwrap.dedent(EXPERIMENT.format(seeds=seeds)))
    experiment = sweep.load_experiment(path)
    sweep.run_experiment(experiment, folder, progress=False, compute=fake_compute)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A folder of 2 cells x 2 seeds compacted into part 1, then 1 more seed per cell in runs/;
    and its answer (runs and metrics tables) read before anything was damaged."""
    folder = tmp_path_factory.mktemp("integrity") / "res"
    _sweep(folder, 2)
    compact.compact(folder)
    _sweep(folder, 3)
    store.Store(folder).close()
    return folder, answer(folder)


@pytest.fixture
def folder(built, tmp_path):
    out = tmp_path / "res"
    shutil.copytree(built[0], out)
    return out


def answer(folder):
    """The runs and metrics tables of `fl.load` (in the order it gives them)."""
    res = store.load(folder)
    return res.runs, res.metrics


def served(folder):
    """All the index serves: every run's row, the configs, provenances and cell statuses."""
    st = store.Store(folder)
    frame = st.frame().to_dict("list")
    return frame, st.configs(), st.index().provenances(), st.made(), st.statuses()


def assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        pd.testing.assert_frame_equal(x, y)


def live_bytes(db, data: bytes) -> list[int]:
    """The offsets in `data` (the index file's bytes) of its tables' text values."""
    with sqlite3.connect(db) as connection:
        texts = {
            v.encode()
            for table in ("runs", "configs", "provenance", "parts")
            for row in connection.execute(f"SELECT * FROM {table}")
            for v in row
            if isinstance(v, str) and len(v) > 3
        }
    connection.close()
    spots = set()
    for text in texts:
        at = data.find(text)
        while at >= 0:
            spots.update(range(at, at + len(text)))
            at = data.find(text, at + 1)
    return sorted(spots)


def flip(path, at: int, mask: int = 0x10) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= mask
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------------------------------------
# The index is a cache that cannot change an answer.


def test_a_flipped_digit_in_the_index_never_reaches_an_answer(built, folder):
    db = folder / index.INDEX_FILE
    data = db.read_bytes()
    at = data.index(b'"loss_gap": ') + len(b'"loss_gap": ')
    assert data[at : at + 1].isdigit()
    flip(db, at, 0x01)  # one digit of one run's loss gap: 3 -> 2, or 2 -> 3
    with pytest.warns(records.CorruptRecord, match=r"index.sqlite is damaged \(.*checksum"):
        got = answer(folder)
    assert_same(got, built[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rebuilt: the next reader has nothing to say
        assert_same(answer(folder), built[1])


@pytest.mark.parametrize("damage", ["undecodable", "zeroed"])
def test_an_undecodable_or_malformed_index_is_one_line_and_rebuilt(built, folder, capsys, damage):
    db = folder / index.INDEX_FILE
    data = bytearray(db.read_bytes())
    if damage == "undecodable":  # overwritten bytes inside a config's JSON text
        at = data.index(b'"task": "teacher"')
        data[at + 1 : at + 5] = b"\xff\xfe\xff\xfe"
    else:  # zeroed pages past the first
        data[4096:] = bytes(len(data) - 4096)
    db.write_bytes(bytes(data))
    with pytest.warns(records.CorruptRecord) as caught:
        assert cli.main(["ls", str(folder)]) == 0
        assert cli.main(["show", str(folder)]) == 0
    assert capsys.readouterr().out.count("ok 3  failed 0  missing 0") == 2
    (line,) = [str(w.message) for w in caught]  # one line, then the index is whole again
    assert "index.sqlite is damaged (" in line and "\n" not in line and len(line) < 300
    assert_same(answer(folder), built[1])


def test_an_index_that_cannot_be_written_is_kept_in_memory_with_one_line(
    built, folder, monkeypatch
):
    connect = sqlite3.connect

    def read_only(path, *args, **kw):  # as for an index file the user cannot write
        if str(path).endswith(index.INDEX_FILE):
            return connect(f"file:{path}?mode=ro", *args, uri=True, **kw)
        return connect(path, *args, **kw)

    monkeypatch.setattr(index.sqlite3, "connect", read_only)
    (folder / "runs" / next((folder / "runs").glob("*.json")).name).unlink()  # to be redone
    with pytest.warns(records.CorruptRecord, match="index.sqlite cannot be written .*in memory"):
        _sweep(folder, 3)  # the resume writes a record (and its index row)
    monkeypatch.undo()
    assert_same(answer(folder), built[1])


# ---------------------------------------------------------------------------------------------
# A damaged compacted part: every reader, every time; its runs damaged, not missing.


def test_a_missing_metrics_part_is_named_by_every_reader_and_its_records_still_serve(
    built, folder, capsys
):
    (folder / "compact" / "metrics-0001.parquet").unlink()
    for _ in range(2):  # every time
        with pytest.warns(records.CorruptRecord, match="metrics-0001.parquet cannot be read"):
            runs, metrics = answer(folder)
        pd.testing.assert_frame_equal(runs, built[1][0])  # the records part serves the runs
        compacted = set(runs["run_id"]) - set(metrics["run_id"][metrics["metric"] == "loss"])
        assert len(compacted) == 4  # their per-step metrics are not made up
    with pytest.warns(records.CorruptRecord, match="records-0001.parquet: damaged"):
        assert cli.main(["ls", str(folder)]) == 0
    assert capsys.readouterr().out.count("ok 1  failed 0  missing 0  damaged 2") == 2
    assert cli.main(["compact", "--check", str(folder)]) == 1
    shown = capsys.readouterr().out
    assert "records-0001.parquet: damaged (metrics-0001.parquet cannot be read" in shown
    assert "1 parts checked, 1 damaged" in shown
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", records.CorruptRecord)
        _sweep(folder, 3)  # a rerun computes the damaged runs again
    assert store.Store(folder).damaged() == {}
    assert_same(answer(folder), built[1])


def test_a_record_whose_bytes_are_not_utf8_is_named_and_the_others_serve(built, folder):
    """A flipped byte that zstd still decodes can leave a record's text not UTF-8 (pyarrow
    then raises for the whole column): that record is named and skipped, the rest serve."""
    path = folder / "compact" / "records-0001.parquet"
    table = pq.read_table(path)
    texts = table["record"].cast(pa.binary()).to_pylist()
    texts[1] = texts[1][:40] + b"\xd4" + texts[1][41:]  # 0xd4 then ASCII: not UTF-8
    raw = pa.array(texts, pa.binary())
    broken = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())  # unvalidated
    column = table.schema.get_field_index("record")
    pq.write_table(table.set_column(column, "record", broken), path, compression="zstd")
    bad_id = table["run_id"][1].as_py()
    for _ in range(2):  # every time
        with pytest.warns(records.CorruptRecord, match=f"not UTF-8.*{bad_id}"):
            runs, metrics = answer(folder)
        reference_runs = built[1][0]
        assert set(runs["run_id"]) == set(reference_runs["run_id"]) - {bad_id}
        shown = reference_runs[reference_runs["run_id"] != bad_id].reset_index(drop=True)
        pd.testing.assert_frame_equal(runs, shown)


def test_compact_check_and_compaction_before_any_run(built, folder, tmp_path, capsys):
    assert cli.main(["compact", "--check", str(folder)]) == 0
    assert "records-0001.parquet: ok, 4 runs" in capsys.readouterr().out
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "experiment.json").write_text('{"name": "exp", "cells": []}')
    assert cli.main(["compact", str(fresh)]) == 0  # a sweep that has not finished a run yet
    assert "0 runs compacted" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Random byte flips: each detected (a warning names the file) or harmless.


@pytest.mark.parametrize(
    "target", [index.INDEX_FILE, "compact/records-0001.parquet", "compact/metrics-0001.parquet"]
)
def test_random_byte_flips_are_each_detected_or_harmless(built, folder, target):
    reference_runs, reference_metrics = built[1]
    reference_served = served(folder)
    path = folder / target
    intact = path.read_bytes()
    rng = random.Random(target)
    spots = range(len(intact))
    if target == index.INDEX_FILE:  # the bytes of its rows' values (most pages are empty)
        spots = live_bytes(path, intact)
    for _ in range(100):
        data = bytearray(intact)
        data[rng.choice(spots)] ^= rng.randrange(1, 256)
        for log in folder.glob(f"{index.INDEX_FILE}-*"):  # a rebuilt index's WAL
            log.unlink()  # would serve its pages in place of the flipped file's
        path.write_bytes(bytes(data))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if target == index.INDEX_FILE:  # all it serves (the files serve the metrics)
                assert served(folder) == reference_served  # it never changes an answer
                continue
            runs, metrics = answer(folder)
        named = [str(w.message) for w in caught if path.name in str(w.message)]
        same = runs.equals(reference_runs) and metrics.equals(reference_metrics)
        assert same or named, "a changed answer without a word"
        shown = reference_runs[reference_runs["run_id"].isin(runs["run_id"])]
        pd.testing.assert_frame_equal(runs, shown.reset_index(drop=True))  # intact records
        found = metrics.merge(reference_metrics, how="left", indicator=True)["_merge"]
        assert (found == "both").all()  # every metric value shown is an intact file's
    path.write_bytes(intact)
