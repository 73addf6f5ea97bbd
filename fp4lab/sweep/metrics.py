"""Per-step metrics on disk: one run's long table (run_id, step, metric, value) as Parquet.

A run record of schema 3 keeps its series and telemetry in `runs/<run_id>.parquet`; records of
schema 1 and 2 keep them inside the JSON. These helpers turn either into the same long table,
and back into a record's `series` and `telemetry` dicts. The compacted dataset
(`fp4lab.sweep.compact`) holds the same columns, plus the run's recorded cell and seeds.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["SCHEMA", "parquet_bytes", "read_file", "series_of", "table", "table_of"]

SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("step", pa.int64()),
        ("metric", pa.string()),
        ("value", pa.float64()),
    ]
)


def table(rid: str, series: dict, telemetry: dict) -> pa.Table:
    """One run's per-step metrics, long, as an Arrow table (series first, then telemetry)."""
    names, steps, values = [], [], []
    for name, v in series.items():
        values.append(np.asarray(v, np.float64).ravel())
        steps.append(np.arange(len(values[-1]), dtype=np.int64))
        names.append(name)
    tel_steps = np.asarray(telemetry.get("steps", []), np.int64)
    for name, v in (telemetry.get("metrics") or {}).items():
        values.append(np.asarray(v, np.float64).ravel())
        steps.append(tel_steps)
        names.append(name)
    sizes = [len(v) for v in values]
    if not values:
        return SCHEMA.empty_table()
    metric = pa.DictionaryArray.from_arrays(
        np.repeat(np.arange(len(names), dtype=np.int32), sizes), pa.array(names, pa.string())
    )
    return pa.table(
        {
            "run_id": pa.array([rid] * sum(sizes), pa.string()),
            "step": np.concatenate(steps),
            "metric": metric.cast(pa.string()),
            "value": np.concatenate(values),
        },
        schema=SCHEMA,
    )


def parquet_bytes(metrics: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(metrics, sink, compression="zstd", use_dictionary=["run_id", "metric"])
    return sink.getvalue()


def read_file(path: Path) -> pa.Table:
    return pq.read_table(path, schema=SCHEMA)


def table_of(record: dict[str, Any], runs_dir: Path) -> pa.Table:
    """A run's rows of the metrics table from `runs/`: its Parquet file, or (records of schema 1
    and 2) its series and telemetry from the JSON."""
    if record.get("metrics") is not None:
        return read_file(runs_dir / record["metrics"]["file"])
    return table(record["run_id"], record.get("series") or {}, record.get("telemetry") or {})


def series_of(record: dict[str, Any], metrics: pa.Table) -> dict[str, Any]:
    """The record with `series` and `telemetry` filled in from its long metrics table (as the
    JSON of older records holds them: lists of numbers)."""
    frame = metrics.to_pandas()
    series, tel = {}, {"steps": [], "metrics": {}}
    for name, group in frame.groupby("metric", sort=False):
        if name in record["metrics"].get("series", ()):
            series[name] = group["value"].tolist()
        else:
            tel["metrics"][name] = group["value"].tolist()
            tel["steps"] = group["step"].tolist()
    return record | {"series": series, "telemetry": tel}
