"""The tables of `fp4lab.sweep.store.load`, built from the index's summaries of the runs: the runs
table by column (each config's columns computed once, however many runs share it), the
provenance table, and the metrics table read from the runs' metrics files or compacted parts
(`fp4lab.sweep.compact`), only the rows asked for.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from fp4lab.schema import SEED_COLUMNS, STREAMS
from fp4lab.sweep import compact
from fp4lab.sweep import metrics as metrics_file
from fp4lab.sweep.provenance import code_version

__all__ = [
    "PROVENANCE",
    "filtered",
    "metric_names",
    "metrics_frame",
    "provenance_frame",
    "runs_frame",
]


def _config_value(v):
    return json.dumps(v) if isinstance(v, list | dict) else v


PROVENANCE = ["run_id", "numerics", "code", "jax", "jaxlib", "flax", "device"]
PROVENANCE += ["cpu", "backend", "python", "time_utc"]


def metric_names(metrics) -> list[str] | None | bool:
    if isinstance(metrics, bool):
        return None if metrics else False
    names = [metrics] if isinstance(metrics, str) else metrics
    if not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"load: metrics={metrics!r}; give True, False, a name or a list of names")
    return list(names)


def filtered(chosen, cells, seeds) -> list[tuple[dict, str]]:
    """The (record, label) pairs of the cells and seeds asked for (all for None)."""
    if cells is not None:
        cells = [cells] if isinstance(cells, str) else list(cells)
        have = set(label for _, label in chosen)
        if unknown := [c for c in cells if c not in have]:
            raise ValueError(f"load: no cell {unknown[0]!r}; cells: {', '.join(sorted(have))}")
        chosen = [(r, label) for r, label in chosen if label in set(cells)]
    for stream, allowed in (seeds or {}).items():
        if stream not in STREAMS:
            raise ValueError(f"load: seeds has {stream!r}; streams: {', '.join(STREAMS)}")
        allowed = {int(s) for s in ([allowed] if isinstance(allowed, int) else allowed)}
        chosen = [(r, label) for r, label in chosen if r["seeds"][stream] in allowed]
    return chosen


def runs_frame(chosen, name: str | None, columns: Callable) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """The runs table, built by column: the config columns once per config."""
    if not chosen:
        return pd.DataFrame(), ()
    base = {
        "run_id": [r["run_id"] for r, _ in chosen],
        "experiment": [name or r["experiment"] for r, _ in chosen],
        "cell": [label for _, label in chosen],
        "status": [r["status"] for r, _ in chosen],
    }
    for s, col in zip(STREAMS, SEED_COLUMNS, strict=True):
        base[col] = [r["seeds"][s] for r, _ in chosen]
    by_config: dict[int, dict] = {}
    fields: dict[str, None] = {}
    for r, _ in chosen:
        if id(r["config"]) not in by_config:
            config = r["config"]
            values = columns(config)
            by_config[id(config)] = {k: _config_value(v) for k, v in values.items()}
            fields |= dict.fromkeys(config) | dict.fromkeys(values)
    configs = pd.DataFrame([by_config[id(r["config"])] for r, _ in chosen])
    summary = pd.DataFrame([r.get("summary") or {} for r, _ in chosen], index=configs.index)
    frame = pd.concat(
        [pd.DataFrame(base), configs.drop(columns=list(summary.columns), errors="ignore"), summary],
        axis=1,
    )
    wall = [r.get("wall_s") for r, _ in chosen]
    frame["wall_s"] = np.asarray([np.nan if w is None else w for w in wall], np.float64)
    return frame, tuple(fields)


def metrics_frame(store, chosen: list[dict], names) -> pd.DataFrame:
    """The long metrics table of the chosen runs: their metrics files or compacted parts, the
    metrics `names` only (None: all; False: none), then each run's final eval_loss."""
    empty = pd.DataFrame({"run_id": [], "step": [], "metric": [], "value": []})
    if names is False or not chosen:
        return empty.astype({"run_id": str, "step": np.int64, "metric": str, "value": np.float64})
    rows = {row[0]: row for row in store.index().rows()}
    parts, by_part = [], {}
    for r in chosen:
        rid, source, has_file = r["run_id"], rows[r["run_id"]][-2], rows[r["run_id"]][-3]
        if source != "runs" and has_file:
            by_part.setdefault(source, []).append(r)
        elif source == "runs" and has_file:
            parts.append(metrics_file.read_file(store.runs_dir / f"{rid}.parquet"))
        else:  # older records: the series inside the JSON
            parts.append(metrics_file.table_of(store.read(rid, metrics=False), store.runs_dir))
    for source, rs in by_part.items():
        cells = {r["cell"] for r in rs}
        parts.append(
            compact.read_metrics(store.path, source, [r["run_id"] for r in rs], names, cells)
        )
    final = [r for r in chosen if (r.get("summary") or {}).get("eval_loss") is not None]
    if names is None or "eval_loss" in names:
        parts.append(
            pa.table(
                {
                    "run_id": [r["run_id"] for r in final],
                    "step": pa.array([r["config"]["steps"] for r in final], pa.int64()),
                    "metric": ["eval_loss"] * len(final),
                    "value": pa.array([r["summary"]["eval_loss"] for r in final], pa.float64()),
                },
                schema=metrics_file.SCHEMA,
            )
        )
    table = pa.concat_tables(parts)
    if names is not None:
        table = table.filter(pc.is_in(table["metric"], pa.array(names, pa.string())))
    frame = table.to_pandas()
    order = {rid: i for i, rid in enumerate(sorted({r["run_id"] for r in chosen}))}
    frame = frame.iloc[np.argsort(frame["run_id"].map(order).to_numpy(), kind="stable")]
    frame = frame.reset_index(drop=True)
    return frame.astype({"run_id": str, "step": np.int64, "metric": str, "value": np.float64})


def provenance_frame(chosen: list[dict[str, Any]]) -> pd.DataFrame:
    """The provenance table of the chosen runs (one row each)."""
    return pd.DataFrame([_provenance_row(r) for r in chosen], columns=PROVENANCE)


def _provenance_row(r: dict[str, Any]) -> dict[str, Any]:
    prov = r.get("provenance") or {}
    versions = prov.get("versions") or {}
    row = {"run_id": r["run_id"], "numerics": r.get("numerics", 1), "code": code_version(prov)}
    row |= {k: versions.get(k) for k in ("jax", "jaxlib", "flax")}
    return row | {k: prov.get(k) for k in ("device", "cpu", "backend", "python", "time_utc")}
