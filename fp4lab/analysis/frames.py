"""The two tables of a results folder, and telemetry metrics as tidy rows.

    runs      one row per run (sweep cell x seed triple): identity, seeds, config, summaries
    metrics   long table (run_id, step, metric, value)

Metric names are the keys of `fp4lab.schema` (`quant/<layer>/<gemm>/<operand>/<stat>`,
`grad/<layer>/<stat>`); `to_frame` turns a flat metrics dict into tidy rows and
`quant_telemetry` / `grad_telemetry` parse a metrics table's names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from fp4lab.analysis.columns import require
from fp4lab.schema import RUNS_COLUMNS, SEED_COLUMNS, parse_key

__all__ = [
    "SEEDS",
    "IDENTITY",
    "SUMMARIES",
    "ok_runs",
    "to_frame",
    "scalar_metric",
    "quant_telemetry",
    "grad_telemetry",
    "acc_telemetry",
    "attach",
    "layer_order",
    "depths",
]

SEEDS = SEED_COLUMNS  # seed_init, seed_data, seed_quant
METRICS = ("run_id", "step", "metric", "value")
IDENTITY = ("run_id", "experiment", "cell", "status")
# every other column of a runs table (`schema.RUNS_COLUMNS`): the summaries a run gives, its
# outcomes and by-products (initial_loss, the spike columns, no_seam, wall_s), never a design
# factor that cells differ in; derived, so that a new summary column cannot be taken for one
SUMMARIES = tuple(c for c in RUNS_COLUMNS if c not in (*IDENTITY, *SEEDS))


def ok_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that finished (status "ok"): the only ones that give outcomes."""
    require(runs, ("status",), "ok_runs")
    return runs[runs["status"] == "ok"]


def to_frame(metrics: dict, step=None) -> pd.DataFrame:
    """Tidy rows (step, layer, gemm, operand, stat, value) from flat telemetry metrics.

    Values may be scalars (one step: `step` labels it) or arrays with a leading step axis
    (e.g. stacked by lax.scan; `step` then gives the step numbers, default 0..n-1). Keys that
    are not telemetry keys are skipped; `grad/` keys get gemm "wgrad" and operand "grad".
    """
    rows = []
    for key, value in metrics.items():
        parsed = parse_key(key)
        if parsed is None:
            continue
        v = np.asarray(value, np.float64).reshape(-1)
        steps = np.arange(len(v)) if step is None else np.asarray(step).reshape(-1)
        if len(steps) == 1 and len(v) == 1:
            steps = [0 if step is None else int(np.asarray(step).reshape(-1)[0])]
        for s, x in zip(steps, v, strict=True):
            rows.append((int(s), parsed.layer, parsed.gemm, parsed.operand, parsed.stat, float(x)))
    return pd.DataFrame(rows, columns=["step", "layer", "gemm", "operand", "stat", "value"])


def scalar_metric(metrics: pd.DataFrame, name: str) -> pd.DataFrame:
    """Rows (run_id, step, value) of one scalar metric ("loss", "grad_norm", "eval_loss", ...)."""
    require(metrics, METRICS, "scalar_metric", "metrics")
    rows = metrics[metrics["metric"] == name]
    return rows[["run_id", "step", "value"]].reset_index(drop=True)


def _parse(metrics: pd.DataFrame, kind: str, index: list[str], wide: bool) -> pd.DataFrame:
    require(metrics, METRICS, f"{kind}_telemetry", "metrics")
    rows = metrics[metrics["metric"].str.startswith(kind + "/")]
    parsed = {name: parse_key(name) for name in rows["metric"].unique()}  # each name once
    columns = [*index, "stat"]
    keys = pd.DataFrame(
        [[getattr(k, c) for c in columns] for k in parsed.values() if k is not None],
        index=[n for n, k in parsed.items() if k is not None],
        columns=columns,
        dtype=object,
    )
    rows = rows[rows["metric"].isin(keys.index)]
    parts = keys.loc[rows["metric"]].set_axis(rows.index)
    tidy = pd.concat([rows[["run_id", "step"]], parts, rows[["value"]]], axis=1)
    tidy = tidy.reset_index(drop=True)
    if not wide:
        return tidy
    out = tidy.set_index(["run_id", "step", *index, "stat"])["value"].unstack("stat")
    return out.reset_index().rename_axis(columns=None)


def quant_telemetry(metrics: pd.DataFrame, *, wide: bool = False) -> pd.DataFrame:
    """Quantizer statistics, parsed from keys quant/<layer>/<gemm>/<operand>/<stat>.

    Returns tidy rows (run_id, step, layer, gemm, operand, stat, value), or with wide=True one
    row per (run_id, step, layer, gemm, operand) and one column per statistic (rel_err, bias,
    flush, saturated, underflow, map4; see fp4lab.core.stats for their formulas).
    """
    return _parse(metrics, "quant", ["layer", "gemm", "operand"], wide)


def grad_telemetry(metrics: pd.DataFrame, *, wide: bool = False) -> pd.DataFrame:
    """Shadow-gradient statistics, parsed from keys grad/<layer>/<stat>.

    Returns tidy rows (run_id, step, layer, stat, value), or with wide=True one row per
    (run_id, step, layer) with columns cos, rel_norm, gnr (+inf: no quantization noise),
    below_sqrt3.
    """
    return _parse(metrics, "grad", ["layer"], wide)


def acc_telemetry(metrics: pd.DataFrame, *, wide: bool = False) -> pd.DataFrame:
    """Accumulated drift against the high-precision shadow, parsed from keys
    acc/<layer>/<direction>/<stat>.

    Returns tidy rows (run_id, step, layer, direction, stat, value): direction "fwd" (the op's
    output; stats rel_drift, local) or "bwd" (the cotangent arriving at it; rel_drift, cos).
    With wide=True one row per (run_id, step, layer, direction) and one column per statistic.
    """
    return _parse(metrics, "acc", ["layer", "gemm"], wide).rename(columns={"gemm": "direction"})


def attach(frame: pd.DataFrame, runs: pd.DataFrame, columns: Sequence[str] = ("cell",)):
    """`frame` (with a run_id column) joined with the given columns of the runs table."""
    require(frame, ("run_id",), "attach", "frame")
    require(runs, ("run_id", *columns), "attach")
    return frame.merge(runs[["run_id", *columns]], on="run_id", how="left")


def depths(metrics: pd.DataFrame) -> dict[str, float]:
    """{layer: depth} from the `depth/<layer>` rows of a metrics table (each layer's position in
    the forward's order of quantized ops, `fp4lab.nnx.telemetry.depths`); {} when absent."""
    require(metrics, ("metric", "value"), "depths", "metrics")
    rows = metrics[metrics["metric"].str.startswith("depth/")]
    if rows.empty:
        return {}
    median = rows.groupby("metric")["value"].median()
    return {name.removeprefix("depth/"): float(v) for name, v in median.items()}


def layer_order(layers: Iterable[str], depth: dict[str, float] | None = None) -> list[str]:
    """Layer paths in depth order where `depth` (`depths(metrics)`) knows them, a parameter
    ("blocks.0.mlp.up.kernel") at the depth of its op; the rest after them in natural order
    (blocks.2 before blocks.10)."""

    def natural(path: str):
        return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path)]

    def at(path: str) -> float | None:
        depth_ = depth or {}
        while path:
            if path in depth_:
                return depth_[path]
            path = path.rpartition(".")[0]
        return None

    def key(path: str):
        d = at(path)
        return (0, d, natural(path)) if d is not None else (1, 0.0, natural(path))

    return sorted(set(layers), key=key)
