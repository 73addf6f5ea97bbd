"""Per-step metrics as Parquet beside the JSON record: round trip, integrity, old records."""

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fp4lab.sweep import records, store


def record(rid="0123456789abcdef", steps=4):
    loss = np.linspace(3, 2, steps, dtype=np.float32)
    loss[1] = np.nan
    return {
        "run_id": rid,
        "experiment": "exp",
        "cell": "a",
        "config": {"steps": steps},
        "seeds": {"init": 0, "data": 1, "quant": 2},
        "status": "ok",
        "summary": {"final_loss": 2.0, "eval_loss": 2.5},
        "series": {"loss": loss, "grad_norm": np.ones(steps, np.float32)},
        "telemetry": {"steps": [0, 2], "metrics": {"quant/x/fprop/x/rel_err": [0.1, 0.2]}},
        "wall_s": 1.0,
    }


def test_metrics_round_trip_through_parquet_and_load_as_the_json_layout(tmp_path):
    new, old = store.Store(tmp_path / "new"), store.Store(tmp_path / "old")
    new.write(record())
    body = json.loads(new.file(record()["run_id"]).read_text())
    assert "series" not in body and "telemetry" not in body
    assert body["metrics"]["file"] == "0123456789abcdef.parquet"
    assert (new.runs_dir / body["metrics"]["file"]).is_file()
    # the same run in the JSON-only layout of schema 2, as the committed results hold it
    legacy, _ = records.seal(record())
    legacy["schema"] = 2
    del legacy["checksum"]
    legacy["checksum"] = records.hashlib.sha256(records.canonical(legacy).encode()).hexdigest()
    records.write_atomic(old.file(legacy["run_id"]), json.dumps(legacy))
    a, b = new.read(legacy["run_id"]), old.read(legacy["run_id"])
    for part in ("series", "telemetry"):
        assert json.dumps(a[part]) == json.dumps(b[part])  # NaN included
    pd.testing.assert_frame_equal(store.load(new.path).metrics, store.load(old.path).metrics)
    m = store.load(new.path).metrics
    assert list(m["metric"].unique()) == [
        "loss",
        "grad_norm",
        "quant/x/fprop/x/rel_err",
        "eval_loss",
    ]
    assert np.isnan(m["value"][1]) and m["value"][0] == np.float32(3.0)


def test_an_edited_or_missing_parquet_file_makes_the_record_bad(tmp_path):
    st = store.Store(tmp_path)
    rid = record()["run_id"]
    st.write(record())
    parquet = st.runs_dir / f"{rid}.parquet"
    parquet.write_bytes(parquet.read_bytes()[:-1] + b"\0")
    with pytest.warns(records.CorruptRecord, match="does not match the record's sha256"):
        assert st.read(rid) is None
    parquet.unlink()
    with pytest.warns(records.CorruptRecord, match="cannot be read"):
        assert st.records() == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st.write(record())  # rewritten: whole again
        assert st.finished(rid)


def test_schema_1_records_load_as_before():
    # two records of schema 1 (as first committed in results/sqrt3): metrics inside the JSON
    results = store.load(Path(__file__).parent / "data" / "schema1")
    m = results.metrics
    assert len(results.runs) == 2 and len(m) == 16562
    assert list(m.columns) == ["run_id", "step", "metric", "value"]
    assert m["step"].dtype == np.int64 and m["value"].dtype == np.float64
    first = m[m["run_id"].eq("0e59b07c2a8f0651") & m["metric"].eq("loss")].head(2)
    np.testing.assert_allclose(first["value"], [2.535776, 2.531449], rtol=1e-6)
    assert set(results.provenance["numerics"]) == {1}
