"""The tables of `fp4lab.sweep.store.load`, built from the index's rows as one DataFrame
(`Store.frame`, one SQL query): the runs table by column (each config's and each provenance's
columns computed once, however many runs share them; the summaries parsed in one call), the
provenance table, and the metrics table read from the runs' metrics files or compacted parts
(`fp4lab.sweep.compact`), only the rows asked for. No run becomes a Python dict of its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from fp4lab.schema import RUNS_COLUMNS, SEED_COLUMNS, STREAMS
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
    "summaries",
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


def filtered(chosen: pd.DataFrame, cells, seeds) -> pd.DataFrame:
    """The rows of the cells (by label) and seeds asked for (all for None)."""
    if cells is not None:
        cells = [cells] if isinstance(cells, str) else list(cells)
        have = set(chosen["label"])
        if unknown := [c for c in cells if c not in have]:
            raise ValueError(f"load: no cell {unknown[0]!r}; cells: {', '.join(sorted(have))}")
        chosen = chosen[chosen["label"].isin(cells)]
    for stream, allowed in (seeds or {}).items():
        if stream not in STREAMS:
            raise ValueError(f"load: seeds has {stream!r}; streams: {', '.join(STREAMS)}")
        allowed = {int(s) for s in ([allowed] if isinstance(allowed, int) else allowed)}
        chosen = chosen[chosen[f"seed_{stream}"].isin(list(allowed))]
    return chosen


def summaries(chosen: pd.DataFrame) -> list[dict[str, Any]]:
    """The summary dict of each row (the index keeps them as JSON text), parsed in one call."""
    return json.loads(f"[{','.join(chosen['summary'])}]")


def runs_frame(
    chosen: pd.DataFrame, configs: dict, summaries: list[dict], name: str | None, columns: Callable
) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """The runs table of the chosen rows (`Store.frame` with labels), by column: the config
    columns computed once per config (`configs`: {config key: (config, data, id)}), then
    taken for each run."""
    if chosen.empty:  # no runs (or none readable): the table's columns all the same
        return pd.DataFrame(columns=list(RUNS_COLUMNS)), ()
    base = {
        "run_id": chosen["run_id"].to_numpy(),
        "experiment": [name] * len(chosen) if name else chosen["experiment"].to_numpy(),
        "cell": chosen["label"].to_numpy(),
        "status": chosen["status"].to_numpy(),
    } | {col: chosen[col].to_numpy() for col in SEED_COLUMNS}
    keys = list(dict.fromkeys(chosen["config_key"]))
    values = {k: columns(configs[k][0]) for k in keys}
    fields: dict[str, None] = {}
    for k in keys:
        fields |= dict.fromkeys(configs[k][0]) | dict.fromkeys(values[k])
    one = pd.DataFrame([{f: _config_value(v) for f, v in values[k].items()} for k in keys])
    at = pd.Index(keys).get_indexer(chosen["config_key"])
    config = one.take(at).reset_index(drop=True)
    summary = pd.DataFrame(summaries, index=config.index)
    frame = pd.concat(
        [pd.DataFrame(base), config.drop(columns=list(summary.columns), errors="ignore"), summary],
        axis=1,
    )
    frame["wall_s"] = np.asarray(chosen["wall_s"].to_numpy(), np.float64)
    return frame, tuple(fields)


def metrics_frame(
    store, chosen: pd.DataFrame, configs: dict, summaries: list[dict], names
) -> pd.DataFrame:
    """The long metrics table of the chosen rows: their metrics files or compacted parts, the
    metrics `names` only (None: all; False: none), then each run's final eval_loss. The
    metrics of runs a damaged compacted part spoils are not read (`Store.damaged`: every reader
    names that part)."""
    empty = pd.DataFrame({"run_id": [], "step": [], "metric": [], "value": []})
    if names is False or chosen.empty:
        return empty.astype({"run_id": str, "step": np.int64, "metric": str, "value": np.float64})
    read = chosen[~chosen["run_id"].isin(list(store.damaged()))]
    has_file = read["has_file"].astype(bool)
    parts = []
    for rid, source, in_file in zip(read["run_id"], read["source"], has_file, strict=True):
        if source == "runs" and in_file:
            parts.append(metrics_file.read_file(store.runs_dir / f"{rid}.parquet"))
        elif not in_file:  # older records: the series inside the JSON
            parts.append(metrics_file.table_of(store.read(rid, metrics=False), store.runs_dir))
    compacted = read[has_file & (read["source"] != "runs")]
    for source, rs in compacted.groupby("source", sort=False):
        parts.append(compact.read_metrics(store.path, source, rs["run_id"], names, set(rs["cell"])))
    if names is None or "eval_loss" in names:
        final = [
            (rid, configs[key][0]["steps"], s["eval_loss"])
            for rid, key, s in zip(chosen["run_id"], chosen["config_key"], summaries, strict=True)
            if s.get("eval_loss") is not None
        ]
        rid, step, value = zip(*final, strict=True) if final else ((), (), ())
        columns = {"run_id": list(rid), "step": pa.array(step, pa.int64())}
        columns |= {"metric": ["eval_loss"] * len(final), "value": pa.array(value, pa.float64())}
        parts.append(pa.table(columns, schema=metrics_file.SCHEMA))
    if not parts:  # every run's metrics lost with a damaged part: said where it was read
        return empty.astype({"run_id": str, "step": np.int64, "metric": str, "value": np.float64})
    table = pa.concat_tables(parts)
    if names is not None:
        table = table.filter(pc.is_in(table["metric"], pa.array(names, pa.string())))
    frame = table.to_pandas()
    order = {rid: i for i, rid in enumerate(sorted(chosen["run_id"]))}
    frame = frame.iloc[np.argsort(frame["run_id"].map(order).to_numpy(), kind="stable")]
    frame = frame.reset_index(drop=True)
    return frame.astype({"run_id": str, "step": np.int64, "metric": str, "value": np.float64})


def provenance_frame(chosen: pd.DataFrame, provenances: dict[str, Any]) -> pd.DataFrame:
    """The provenance table of the chosen rows (one each), each provenance's columns computed
    once (`provenances`: {provenance key: provenance}, `Index.provenances`)."""
    if chosen.empty:
        return pd.DataFrame(columns=PROVENANCE)
    keys = list(dict.fromkeys(chosen["prov_key"]))
    one = pd.DataFrame([_provenance_row(provenances.get(k)) for k in keys])
    frame = one.take(pd.Index(keys).get_indexer(chosen["prov_key"])).reset_index(drop=True)
    frame.insert(0, "run_id", chosen["run_id"].to_numpy())
    frame.insert(1, "numerics", chosen["numerics"].to_numpy())
    return frame[PROVENANCE]


def _provenance_row(prov: dict[str, Any] | None) -> dict[str, Any]:
    prov = prov or {}
    versions = prov.get("versions") or {}
    row = {"code": code_version(prov)} | {k: versions.get(k) for k in ("jax", "jaxlib", "flax")}
    return row | {k: prov.get(k) for k in ("device", "cpu", "backend", "python", "time_utc")}
