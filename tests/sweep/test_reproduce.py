"""One stored run reproduced bit for bit outside the sweep, through the same batched path."""

import json
import shutil
import textwrap

import numpy as np
import pytest

from fp4lab import sweep
from fp4lab.sweep import compact, records, store

EXPERIMENT = """
from fp4lab.train.config import Config

def get_config():
    return Config(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,),
                  batch_size=32, steps=4, eval_batches=1, seed_batch=2, telemetry_every=2,
                  recipe="nvfp4")

def sweep(add):
    add("x", seeds=3)  # seeds 0, 1 share a call; seed 2 runs padded with a copy of itself
"""


def test_reproduce_gives_the_stored_bits_and_flags_a_difference(tmp_path):
    path = tmp_path / "exp.py"
    path.write_text(textwrap.dedent(EXPERIMENT))
    out = tmp_path / "res"
    sweep.run_experiment(sweep.load_experiment(path), out, progress=False)
    runs = store.load(out).runs
    for rid in runs["run_id"]:
        fresh = sweep.reproduce(out, rid)  # raises on any differing bit
        stored = store.Store(out).read(rid)
        assert np.array_equal(np.asarray(stored["series"]["loss"]), fresh["series"]["loss"])
        assert fresh["telemetry"]["metrics"]  # telemetry compared too
    # a record whose numbers differ in the last bit is not reproduced
    rid = runs["run_id"].iloc[1]
    body = store.Store(out).read(rid)  # the record with its series (from its Parquet file)
    for field in ("checksum", "schema", "metrics"):
        body.pop(field, None)
    loss = np.asarray(body["series"]["loss"], np.float32)
    loss[-1] = np.nextafter(loss[-1], np.float32(np.inf))
    body["series"]["loss"] = loss.tolist()
    store.Store(out).write(body)
    with pytest.raises(sweep.ReproductionError, match=rf"run {rid}: series\['loss'\] differs") as e:
        sweep.reproduce(out, rid)
    assert "CPU" not in str(e.value)  # made on this CPU: no hint
    # made on another CPU, or on one the record does not name: the error says so
    body["provenance"]["cpu"] = "Another CPU [avx2 fma]"
    store.Store(out).write(body)
    with pytest.raises(sweep.ReproductionError, match=r"differs.*made on Another CPU \[avx2 fma\]"):
        sweep.reproduce(out, rid)
    del body["provenance"]["cpu"]
    store.Store(out).write(body)
    with pytest.raises(sweep.ReproductionError, match="a CPU its record does not name; this is"):
        sweep.reproduce(out, rid)
    with pytest.raises(sweep.ReproductionError, match="no valid record"):
        sweep.reproduce(out, "0" * 16)


def test_an_output_the_record_predates_is_not_compared_but_a_missing_one_is(tmp_path):
    path = tmp_path / "exp.py"
    path.write_text(textwrap.dedent(EXPERIMENT).replace("seeds=3", "seeds=1"))
    out = tmp_path / "res"
    sweep.run_experiment(sweep.load_experiment(path), out, progress=False)
    (rid,) = store.load(out).runs["run_id"]
    f = store.Store(out).file(rid)
    body = json.loads(f.read_text())
    del body["checksum"], body["schema"]
    del body["summary"]["eval_hp"]  # a record older than the eval_hp output
    f.write_text(records.seal(body)[1])
    assert sweep.reproduce(out, rid)["summary"]["eval_hp"] > 0
    body["summary"]["learned"] = not body["summary"]["learned"]  # an older rule's judgement
    f.write_text(records.seal(body)[1])
    assert sweep.reproduce(out, rid)["summary"]["eval_hp"] > 0  # the numbers still reproduce
    body["summary"]["no_such_output"] = 1.0  # the record has it, the code does not
    f.write_text(records.seal(body)[1])
    with pytest.raises(sweep.ReproductionError, match="no_such_output"):
        sweep.reproduce(out, rid)


def test_a_run_whose_metrics_thinning_dropped_is_regenerated_bit_for_bit(tmp_path):
    """A folder compacted with `keep_metrics` (as results/randomness_vs_error*) keeps every
    record but the per-step metrics of some runs only; `reproduce` on a dropped run gives its
    series and telemetry as the unthinned folder holds them, every bit."""
    path = tmp_path / "exp.py"
    path.write_text(textwrap.dedent(EXPERIMENT))
    full, thinned = tmp_path / "full", tmp_path / "thinned"
    sweep.run_experiment(sweep.load_experiment(path), full, progress=False)
    shutil.copytree(full, thinned, ignore=shutil.ignore_patterns("index.sqlite*"))
    compact.compact(thinned, keep_metrics=lambda record: record["seeds"]["init"] == 0)
    kept = store.load(thinned, metrics="loss").metrics  # eval_loss: every run's, its summary's
    dropped = [rid for rid in store.load(thinned).runs["run_id"] if rid not in set(kept["run_id"])]
    assert len(dropped) == 2 and kept["run_id"].nunique() == 1
    for rid in dropped:
        assert "series" not in store.Store(thinned).read(rid)  # nothing of it left to compare
        fresh = sweep.reproduce(thinned, rid)  # checks the summary the record keeps
        stored = store.Store(full).read(rid)
        for name, values in stored["series"].items():
            assert np.array_equal(np.asarray(values, np.float32), fresh["series"][name])
        tel, fresh_tel = stored["telemetry"], fresh["telemetry"]
        assert list(tel["steps"]) == list(fresh_tel["steps"]) and tel["metrics"]
        for name, values in tel["metrics"].items():
            new = np.asarray(fresh_tel["metrics"][name], np.float64).ravel()
            assert np.array_equal(np.asarray(values), new, equal_nan=True), name
