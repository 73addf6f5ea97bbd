"""The figures' shared style and helpers: seaborn's paper style, the colour scales of
telemetry statistics, Agg figures without pyplot, and the small table helpers they share."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import colors as mcolors
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fp4lab.schema import ACC_STATS, GRAD_NOISE_STATS, GRAD_STATS, STATS

SIGNED = ("bias",)  # drawn with a diverging map centred at 0
LOG_STATS = ("rel_err", "rel_drift", "local")  # errors: a log colour scale when they span decades
DPI = 150
LINESTYLES = ("-", "--", "-.", ":")
# a heatmap cell without a value (the operand is not quantized): hatched light grey, never a
# colour of the scale; a non-finite value (a diverged run, an infinite ratio) is plain grey
HATCHED = dict(facecolor="0.93", edgecolor="0.6", hatch="////", lw=0)
NON_FINITE = "0.85"


def styled(fn):
    """Runs a figure function under the package style (the style is read while drawing)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with sns.axes_style("whitegrid"), sns.plotting_context("paper", font_scale=1.15):
            return fn(*args, **kwargs)

    return wrapper


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def finite_values(values: pd.Series) -> pd.Series:
    """inf (e.g. a gradient-to-noise ratio without noise) -> NaN, so it is left out, not drawn."""
    return values.astype(np.float64).replace([np.inf, -np.inf], np.nan)


def cell_edges(centres: np.ndarray) -> np.ndarray:
    """Cell edges around sorted centres (logged steps need not be evenly spaced)."""
    if len(centres) == 1:
        return np.array([centres[0] - 0.5, centres[0] + 0.5])
    mid = (centres[1:] + centres[:-1]) / 2
    return np.concatenate([[2 * centres[0] - mid[0]], mid, [2 * centres[-1] - mid[-1]]])


def select_cell(frame: pd.DataFrame, runs: pd.DataFrame | None, cell: str | None) -> pd.DataFrame:
    if cell is None:
        return frame
    if runs is None:
        raise ValueError("selecting a cell needs the runs table (runs=...)")
    return frame[frame["run_id"].isin(runs.loc[runs["cell"] == cell, "run_id"])]


def telemetry_kind(stat: str, kind: str | None) -> str:
    """Which telemetry a statistic comes from: "quant", "grad" or "acc" ("cos" is both a
    shadow-gradient and a drift statistic: the gradient's unless kind="acc")."""
    drift = {s for stats in ACC_STATS.values() for s in stats}
    known = {"quant": set(STATS), "grad": {*GRAD_STATS, *GRAD_NOISE_STATS}, "acc": drift}
    if kind is not None:
        if kind not in known:
            raise ValueError(f"kind must be one of {sorted(known)}, got {kind!r}")
        if stat not in known[kind]:
            raise ValueError(
                f"{kind} telemetry has no statistic {stat!r}; it has {sorted(known[kind])}"
            )
        return kind
    for name in ("quant", "grad", "acc"):
        if stat in known[name]:
            return name
    allowed = sorted(set().union(*known.values()))
    raise ValueError(f"unknown telemetry statistic {stat!r}; allowed: {allowed}")


def heatmap_norm(values, stat: str) -> mcolors.Normalize:
    """The colour scale of `stat` over `values` (pass the values of every figure that must
    share one scale): diverging around 0 for signed statistics, logarithmic for errors and
    drifts whose positive values span more than a decade (so a high-precision layer does not
    squeeze the FP4 range), else linear."""
    finite = pd.Series(np.asarray(values, np.float64)).replace([np.inf, -np.inf], np.nan).dropna()
    if stat in SIGNED:
        return mcolors.CenteredNorm(
            0.0, max(float(finite.abs().max()), 1e-12) if len(finite) else 1
        )
    lo, hi = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
    positive = finite[finite > 0]
    if stat in LOG_STATS and len(positive) and positive.max() > 10 * positive.min():
        return mcolors.LogNorm(float(positive.min()), float(positive.max()))
    return mcolors.Normalize(lo, hi if hi > lo else lo + 1e-12)


def cells_of(runs: pd.DataFrame, by: str) -> list:
    return list(pd.unique(runs[by]))
