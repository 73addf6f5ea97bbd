"""Figures of a sweep, from the results store's tables only (matplotlib + seaborn).

Every function takes DataFrames and returns a `matplotlib.figure.Figure` drawn on an Agg
canvas, without pyplot: nothing global changes, nothing needs closing, and the same figure
saves to PNG, embeds in the HTML report or shows in a notebook. Styling is seaborn's
"whitegrid" in the "paper" context, the colour-blind palette, and line styles that stay apart
in greyscale print.

    gradient_flow_heatmap   layer x step of a telemetry statistic, one panel per GEMM operand
                            (or per direction of the accumulated drift)
    drift_vs_depth          accumulated drift against depth, forward and backward, seed bands
    loss_curves             median over seeds per cell, with a min-max or interquartile band
    ladder                  horizontal bars with intervals (overhead, rates, shares)
    gnr_curves              gradient-to-noise ratio per layer over steps, with the sqrt(3) line
    format_staircase        error against input scale, one line per format
    standard_figures        the standard set for a results object, written as PNGs

Cells are named in words (`labels.cell_label`: "recipe=nvfp4,wgrad=bf16" reads "NVFP4, Wgrad
in BF16") and statistics by what they measure (`labels.stat_label`); every function that names
cells takes `labels`, a dict {cell name: readable name} that overrides the names it gives.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import colors as mcolors
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import PercentFormatter

from fp4lab.analysis import factors, frames, tables
from fp4lab.analysis.columns import require, require_tables
from fp4lab.analysis.labels import cell_label, stat_label
from fp4lab.schema import ACC_OPERANDS, ACC_STATS, GEMMS, GRAD_STATS, OPERANDS, SQRT3, STATS

__all__ = [
    "gradient_flow_heatmap",
    "heatmap_norm",
    "drift_vs_depth",
    "loss_curves",
    "ladder",
    "gnr_curves",
    "format_staircase",
    "iter_figures",
    "standard_figures",
    "DPI",
]

SIGNED = ("bias",)  # drawn with a diverging map centred at 0
_LOG_STATS = ("rel_err", "rel_drift", "local")  # errors: a log colour scale when they span decades
DPI = 150
_LINESTYLES = ("-", "--", "-.", ":")
# a heatmap cell without a value (the operand is not quantized): hatched light grey, never a
# colour of the scale; a non-finite value (a diverged run, an infinite ratio) is plain grey
_HATCHED = dict(facecolor="0.93", edgecolor="0.6", hatch="////", lw=0)
_NON_FINITE = "0.85"


def _styled(fn):
    """Runs a figure function under the package style (the style is read while drawing)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with sns.axes_style("whitegrid"), sns.plotting_context("paper", font_scale=1.15):
            return fn(*args, **kwargs)

    return wrapper


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _finite(values: pd.Series) -> pd.Series:
    """inf (e.g. a gradient-to-noise ratio without noise) -> NaN, so it is left out, not drawn."""
    return values.astype(np.float64).replace([np.inf, -np.inf], np.nan)


def _edges(centres: np.ndarray) -> np.ndarray:
    """Cell edges around sorted centres (logged steps need not be evenly spaced)."""
    if len(centres) == 1:
        return np.array([centres[0] - 0.5, centres[0] + 0.5])
    mid = (centres[1:] + centres[:-1]) / 2
    return np.concatenate([[2 * centres[0] - mid[0]], mid, [2 * centres[-1] - mid[-1]]])


def _select(frame: pd.DataFrame, runs: pd.DataFrame | None, cell: str | None) -> pd.DataFrame:
    if cell is None:
        return frame
    if runs is None:
        raise ValueError("selecting a cell needs the runs table (runs=...)")
    return frame[frame["run_id"].isin(runs.loc[runs["cell"] == cell, "run_id"])]


def _telemetry_kind(stat: str, kind: str | None) -> str:
    """Which telemetry a statistic comes from: "quant", "grad" or "acc" ("cos" is both a
    shadow-gradient and a drift statistic: the gradient's unless kind="acc")."""
    drift = {s for stats in ACC_STATS.values() for s in stats}
    known = {"quant": set(STATS), "grad": set(GRAD_STATS), "acc": drift}
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


_DIRECTION_TITLES = {
    ("fwd", "rel_drift"): "forward: output y, accumulated drift",
    ("fwd", "local"): "forward: output y, the op's own error",
    ("bwd", "rel_drift"): "backward: cotangent dy, accumulated drift",
    ("bwd", "cos"): "backward: cotangent dy, cosine",
}


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
    if stat in _LOG_STATS and len(positive) and positive.max() > 10 * positive.min():
        return mcolors.LogNorm(float(positive.min()), float(positive.max()))
    return mcolors.Normalize(lo, hi if hi > lo else lo + 1e-12)


def _unquantized(tele: pd.DataFrame, by: Sequence[str] = ()) -> pd.Series:
    """Per row of quantizer telemetry: does it belong to an operand left unquantized?

    The ops record such an operand (a GEMM kept in high precision by a per-GEMM override, the
    backward operands of backward="high_precision") as zeros in every statistic
    (`fp4lab.ops.plan`). An operand whose every recorded statistic is exactly 0 at every logged
    step of the given runs (of each group of `by`, e.g. per run) counts as one; an operand
    quantized without any error at every step (e.g. a BF16 cast of BF16 weights) reads the
    same, and is one in effect.
    """
    keys = [tele[k] for k in (*by, "layer", "gemm", "operand")]
    return tele["value"].eq(0).groupby(keys).transform("all")


def _depth_layers(metrics: pd.DataFrame, runs: pd.DataFrame | None, cell: str | None) -> set:
    """The layers of the selected runs' `depth/<layer>` rows: every measured op the forward ran
    through, whatever telemetry it has."""
    rows = _select(metrics[metrics["metric"].str.startswith("depth/")], runs, cell)
    return set(rows["metric"].str.removeprefix("depth/"))


def _hatch(ax, x_edges: np.ndarray, missing: np.ndarray) -> None:
    """Hatched rectangles over the True cells of `missing` (layers x steps, row i spanning
    y in [i, i+1]), one rectangle per run of adjacent cells in a row."""
    for row, line in enumerate(missing):
        change = np.diff(np.concatenate([[0], line.astype(int), [0]]))
        for a, b in zip(np.flatnonzero(change == 1), np.flatnonzero(change == -1), strict=True):
            ax.add_patch(Rectangle((x_edges[a], row), x_edges[b] - x_edges[a], 1, **_HATCHED))


@_styled
def gradient_flow_heatmap(
    metrics: pd.DataFrame,
    stat: str = "rel_err",
    *,
    runs: pd.DataFrame | None = None,
    cell: str | None = None,
    agg: str = "median",
    kind: str | None = None,
    norm: mcolors.Normalize | None = None,
    labels: Mapping[str, str] | None = None,
) -> Figure:
    """Where quantization error enters, and how it accumulates: a telemetry statistic by layer
    (rows, first layer on top) and step (columns).

    Quantizer statistics (rel_err, bias, flush, saturated, underflow, map4) get one panel per
    GEMM operand: GEMMs as columns (fprop, dgrad, wgrad), their two operands as rows. Shadow-
    gradient statistics (cos, rel_norm, gnr, below_sqrt3) get one panel. Drift statistics
    (`acc/` keys: rel_drift, local, and cos with kind="acc") get one panel per direction,
    forward (the op's output) and backward (the cotangent arriving at it). Panels share one
    colour scale (`heatmap_norm`; pass `norm` to share one across figures). Values are
    aggregated over the selected runs (`agg`, the median over seeds by default).

    A cell without a value is hatched light grey, "not quantized" in the legend, never a colour
    of the scale: an operand the ops record as unquantized (zeros in every statistic at every
    step, e.g. a GEMM kept in high precision by an override), an operand or step with no row,
    and every operand of a layer that `depth/<layer>` names but the statistic's telemetry does
    not. A non-finite value (a diverged run; a gradient-to-noise ratio without noise) is grey.

    Args:
      metrics: the long metrics table. stat: the statistic to draw.
      runs, cell: draw only the runs of this cell (needs the runs table). agg: a pandas reduction.
      kind: "quant", "grad" or "acc" (default: inferred from `stat`). norm: the colour scale.
      labels: {cell name: readable name} for the title (default `labels.cell_label`).
    Returns:
      The figure. Raises ValueError when the metrics hold no such statistic, or only for
      operands that are not quantized.
    """
    require_tables("gradient_flow_heatmap", metrics=metrics, runs=runs, needs=("run_id", "cell"))
    kind = _telemetry_kind(stat, kind)
    if kind == "grad":
        tele = frames.grad_telemetry(metrics)
    elif kind == "acc":
        tele = frames.acc_telemetry(metrics).rename(columns={"direction": "gemm"})
        tele = tele.assign(operand=tele["gemm"].map(ACC_OPERANDS))
    else:
        tele = frames.quant_telemetry(metrics)
    tele = _select(tele, runs, cell)
    if not (tele["stat"] == stat).any():
        raise ValueError(f"no {kind} telemetry for statistic {stat!r}")
    named = set(tele["layer"])
    if kind != "grad":  # op paths, as depth/ names them (grad/ names parameters)
        named |= _depth_layers(metrics, runs, cell)
    layers = frames.layer_order(named, frames.depths(metrics))
    steps = np.sort(tele.loc[tele["stat"] == stat, "step"].unique())
    titles = {}
    if kind == "grad":
        tele = tele.assign(gemm="shadow gradient", operand="")
        panels = [[("shadow gradient", "")]]
        titles[panels[0][0]] = "shadow gradient"
    elif kind == "acc":  # the directions that have the statistic (cos: backward only)
        have = set(tele.loc[tele["stat"] == stat, "gemm"])
        panels = [[(d, ACC_OPERANDS[d]) for d in ACC_STATS if d in have]]
        titles = {(d, ACC_OPERANDS[d]): _DIRECTION_TITLES[d, stat] for d in have}
    else:
        have = set(zip(tele["gemm"], tele["operand"], strict=True))
        gemms = [g for g in GEMMS if any((g, o) in have for o in OPERANDS[g])]
        panels = [[(g, OPERANDS[g][i]) for g in gemms] for i in (0, 1)]
        titles = {(g, o): f"{g} · {o}" for g in gemms for o in OPERANDS[g]}
        tele = tele[~_unquantized(tele)]  # no value: hatched below, never the colour of 0
    tele = tele[tele["stat"] == stat]
    if tele.empty:
        raise ValueError(f"no quantized operand in the telemetry of {stat!r}: none to draw")
    tele = tele.assign(value=_finite(tele["value"]))
    grouped = tele.groupby(["gemm", "operand", "layer", "step"])["value"]
    grid = pd.DataFrame({"value": grouped.agg(agg), "rows": grouped.size()}).reset_index()
    norm = norm or heatmap_norm(grid["value"], stat)
    name = "rocket" if stat == "cos" else "rocket_r"  # dark = worse
    cmap = sns.color_palette("vlag" if stat in SIGNED else name, as_cmap=True)
    cmap = cmap.with_extremes(bad=_NON_FINITE)
    nrows, ncols = len(panels), len(panels[0])
    height = max(2.2, 0.16 * len(layers) + 1.2)
    fig = _figure(3.4 * ncols + 1.2 + (1.0 if kind == "acc" else 0.0), height * nrows + 0.7)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    x_edges = _edges(steps.astype(float))
    mesh, hatched, non_finite = None, False, False
    for i, row in enumerate(panels):
        for j, (gemm, operand) in enumerate(row):
            ax = axes[i, j]
            panel = grid[(grid["gemm"] == gemm) & (grid["operand"] == operand)]
            data, count = (
                panel.pivot(index="layer", columns="step", values=v)
                .reindex(index=layers, columns=steps)
                .to_numpy(np.float64)
                for v in ("value", "rows")
            )
            missing = np.isnan(count)
            mesh = ax.pcolormesh(
                x_edges,
                np.arange(len(layers) + 1),
                np.ma.masked_invalid(data),
                cmap=cmap,
                norm=norm,
            )
            _hatch(ax, x_edges, missing)
            hatched |= bool(missing.any())
            non_finite |= bool((np.isnan(data) & ~missing).any())
            ax.set_title(titles.get((gemm, operand), gemm), fontsize="medium")
            ax.grid(False)
    ax0 = axes[0, 0]
    ax0.invert_yaxis()  # first layer on top
    every = max(1, math.ceil(len(layers) / 40))
    ax0.set_yticks(np.arange(len(layers))[::every] + 0.5, layers[::every])
    for ax in axes[-1]:
        ax.set_xlabel("step")
    fig.colorbar(mesh, ax=axes, label=stat_label(stat, kind=kind), shrink=0.9)
    handles = [Patch(**(_HATCHED | {"lw": 0.5}), label="not quantized")] if hatched else []
    handles += [Patch(facecolor=_NON_FINITE, label="no finite value")] if non_finite else []
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)
    what = stat_label(stat, kind=kind, unit=False)
    fig.suptitle(f"{what} by layer and step" + (f" — {cell_label(cell, labels)}" if cell else ""))
    return fig


@_styled
def drift_vs_depth(
    metrics: pd.DataFrame,
    runs: pd.DataFrame | None = None,
    *,
    stat: str = "rel_drift",
    steps: Sequence[int] | None = None,
    by: str = "cell",
    local: bool = True,
    labels: Mapping[str, str] | None = None,
) -> Figure:
    """Accumulated drift against depth: one panel per direction (forward: each op's output;
    backward: the cotangent arriving at it), layers in depth order on x, a log y axis.

    One line per cell (with `runs`; else one) and chosen step: the median over the cell's
    seeds, with a min-max band over seeds. With `local` (and stat="rel_drift") the forward
    panel also draws each op's own error (`local`, dotted): where the two lines part, error
    has accumulated beyond what the op adds.

    Args:
      metrics: the long metrics table. runs: the runs table, for lines per cell.
      stat: "rel_drift" (both directions) or "cos" (backward). steps: the logged steps to draw
        (default: the last one). by: the runs column naming the lines.
      labels: {cell name: readable name} for the legend (default `labels.cell_label`).
    """
    require_tables("drift_vs_depth", metrics=metrics, runs=runs, needs=("run_id", by))
    tele = frames.acc_telemetry(metrics)
    if tele.empty:
        raise ValueError("no drift telemetry (acc/<layer>/...) in the metrics")
    if stat not in ("rel_drift", "cos"):
        raise ValueError(f"stat must be 'rel_drift' or 'cos', got {stat!r}")
    logged = np.sort(tele["step"].unique())
    steps = [int(logged[-1])] if steps is None else [int(t) for t in steps]
    missing = sorted(set(steps) - set(int(t) for t in logged))
    if missing:
        raise ValueError(f"steps {missing} were not logged; logged steps: {list(logged)}")
    tele = tele[tele["step"].isin(steps)].assign(value=lambda f: _finite(f["value"]))
    if runs is not None:
        tele = frames.attach(tele, runs, [by])
        lines = [c for c in _cells(runs, by) if c in set(tele[by])]
    else:
        tele, lines = tele.assign(**{by: "all runs"}), ["all runs"]
    layers = frames.layer_order(tele["layer"], frames.depths(metrics))
    position = {layer: i for i, layer in enumerate(layers)}
    directions = [d for d in ACC_STATS if stat in ACC_STATS[d] and d in set(tele["direction"])]
    fig = _figure(5.0 * len(directions) + 2.4, 4.0)
    axes = fig.subplots(1, len(directions), squeeze=False, sharey=True)[0]
    palette = sns.color_palette("colorblind")
    handles = []
    for ax, direction in zip(axes, directions, strict=True):
        shown = [(stat, "-")] + ([("local", ":")] if local and direction == "fwd" else [])
        for i, line in enumerate(lines):
            color = palette[i % len(palette)]
            for k, step in enumerate(steps):
                for what, ls in shown:
                    sel = tele[
                        (tele[by] == line)
                        & (tele["step"] == step)
                        & (tele["direction"] == direction)
                        & (tele["stat"] == what)
                    ]
                    if sel.empty:
                        continue
                    g = sel.groupby("layer")["value"]
                    x = np.array([position[layer] for layer in g.median().index])
                    order = np.argsort(x)
                    med, lo, hi = (v.to_numpy()[order] for v in (g.median(), g.min(), g.max()))
                    style = ls if len(steps) == 1 else _LINESTYLES[k % 4]
                    alpha = 1.0 if what == stat else 0.7
                    ax.plot(x[order], med, color=color, ls=style, lw=1.5, alpha=alpha, marker=".")
                    ax.fill_between(x[order], lo, hi, color=color, alpha=0.15, lw=0)
                    if direction == directions[0]:
                        label = cell_label(line, labels, by=by)
                        label += f", step {step}" if len(steps) > 1 else ""
                        label += ", the op's own error" if what == "local" else ""
                        handles.append(Line2D([], [], color=color, ls=style, label=label))
        name = "forward: output y" if direction == "fwd" else "backward: cotangent dy"
        ax.set_title(name)
        ax.set_xticks(np.arange(len(layers)), layers, rotation=90, fontsize="x-small")
        ax.set_xlabel("layer (depth order)")
        if stat == "rel_drift" and (tele["value"] > 0).any():
            ax.set_yscale("log")
    axes[0].set_ylabel("‖y_q − y‖ / ‖y‖" if stat == "rel_drift" else "cos(dy_q, dy)")
    fig.legend(handles=handles, loc="outside right upper", fontsize="small", frameon=False)
    when = f"step {steps[0]}" if len(steps) == 1 else "steps " + ", ".join(map(str, steps))
    title = f"drift against the high-precision shadow by depth, {when} (median, min-max)"
    fig.suptitle(title, x=0.01, ha="left")
    return fig


def _cells(runs: pd.DataFrame, by: str) -> list:
    return list(pd.unique(runs[by]))


@_styled
def loss_curves(
    runs: pd.DataFrame,
    metrics: pd.DataFrame,
    *,
    metric: str = "loss",
    by: str = "cell",
    band: str = "minmax",
    gap: bool = False,
    labels: Mapping[str, str] | None = None,
) -> Figure:
    """Loss over steps per cell: the median over seeds with a band over seeds.

    band="minmax" shades min to max over seeds (every seed inside), "iqr" the 25-75 % quantiles.
    A non-finite value (after a divergence) is left out of the median at that step; the legend
    gives each cell's n and how many of its runs diverged. gap=True draws loss - loss_floor on a
    log axis (how far from the task's exact optimum); otherwise a finite floor shared by all runs
    is drawn as a dashed line.

    Args:
      runs, metrics: the store's tables. metric: "loss", "eval_loss", "grad_norm", ...
      by: the runs column whose values are the curves. band: "minmax" or "iqr". gap: see above.
      labels: {cell name: readable name} for the legend (default `labels.cell_label`).
    """
    need = ("run_id", by, "loss_floor", "status", "diverged")
    require_tables("loss_curves", metrics=metrics, runs=runs, needs=need)
    if band not in ("minmax", "iqr"):
        raise ValueError(f"band must be 'minmax' or 'iqr', got {band!r}")
    curves = frames.attach(frames.scalar_metric(metrics, metric), runs, [by, "loss_floor"])
    if gap:
        curves = curves.assign(value=curves["value"] - curves["loss_floor"])
    curves = curves.assign(value=_finite(curves["value"]))
    fig = _figure(7.0, 4.2)
    ax = fig.subplots()
    palette = sns.color_palette("colorblind")
    cells = [c for c in _cells(runs, by) if c in set(curves[by])]
    for i, c in enumerate(cells):
        wide = curves[curves[by] == c].pivot(index="step", columns="run_id", values="value")
        if band == "minmax":
            lo, hi = wide.min(axis=1), wide.max(axis=1)
        else:
            lo, hi = wide.quantile(0.25, axis=1), wide.quantile(0.75, axis=1)
        ok = runs[(runs[by] == c) & (runs["status"] == "ok")]
        n_div = int(ok["diverged"].astype(bool).sum())
        label = f"{cell_label(c, labels, by=by)} (n={wide.shape[1]}"
        label += f", {n_div} diverged)" if n_div else ")"
        color, ls = palette[i % len(palette)], _LINESTYLES[(i // len(palette)) % 4]
        ax.plot(wide.index, wide.median(axis=1), color=color, ls=ls, lw=1.6, label=label)
        ax.fill_between(wide.index, lo, hi, color=color, alpha=0.18, lw=0)
    floors = runs["loss_floor"].dropna().unique()
    if not gap and len(floors) == 1 and np.isfinite(floors[0]):
        ax.axhline(floors[0], color="0.25", ls="--", lw=1, label="loss floor (optimum)")
    if gap and (curves["value"] > 0).any():
        ax.set_yscale("log")
    ax.set_xlabel("step")
    name = stat_label(metric, unit=False)
    unit = stat_label(metric, task=_task(runs)).removeprefix(name)  # " (nats)" for an LM
    ax.set_ylabel(f"{name} − floor{unit}" if gap else f"{name}{unit}")
    what = "min–max" if band == "minmax" else "interquartile range"
    ax.set_title(f"{name}: median over seeds, band = {what}")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return fig


def _task(runs: pd.DataFrame) -> str | None:
    """The runs' task when they share one (it sets the unit of a loss), else None."""
    tasks = runs["task"].dropna().unique() if "task" in runs else []
    return str(tasks[0]) if len(tasks) == 1 else None


def _fmt(x: float, percent: bool) -> str:
    if np.isnan(x):
        return "?"
    if np.isinf(x):
        return "∞" if x > 0 else "-∞"
    if percent:
        return f"{x:.1%}"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _bar_name(value, column: str, labels: Mapping[str, str] | None) -> str:
    """A ladder's name for a value of a label column: a cell in words, any name as `labels`
    renames it."""
    if column == "cell":
        return cell_label(value, labels)
    return str(labels[value]) if labels is not None and value in labels else str(value)


@_styled
def ladder(
    table: pd.DataFrame,
    value: str,
    *,
    label: str | Sequence[str] = "cell",
    percent: bool = False,
    title: str | None = None,
    xlabel: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> Figure:
    """Horizontal bars with interval whiskers, one per row of an analysis table, in table order.

    The interval comes from the columns `<value>_lo` and `<value>_hi`, as the analysis tables
    name them (overhead, rate, gap, tokens, share). The numbers are printed in a column on the
    right, "estimate [lo, hi]", so the chart reads in greyscale print. An infinite estimate (a
    cell whose seeds mostly never reached the target) is a hatched bar marked "never"; an
    interval open to the right (inf) is an arrow to the edge; NaN is "n/a", never a made-up bar.

    Args:
      table: one row per bar. value: the column drawn.
      label: the column (or columns, joined with ", ") naming each bar; a "cell" column reads
        in words (`labels.cell_label`).
      percent: format the axis and numbers as percentages (ratios such as overhead, shares).
      title, xlabel: override the defaults.
      labels: {name: readable name} overriding the names of the bars' cells (or other names).
    """
    cols = [label] if isinstance(label, str) else list(label)
    require(table, (value, *cols), "ladder", "analysis")
    texts = [[_bar_name(v, col, labels) for v in table[col]] for col in cols]
    names = [", ".join(parts) for parts in zip(*texts, strict=True)]
    nan = pd.Series(np.nan, index=table.index)
    v = table[value].to_numpy(np.float64)
    lo = table.get(f"{value}_lo", nan).to_numpy(np.float64)
    hi = table.get(f"{value}_hi", nan).to_numpy(np.float64)
    shown = np.concatenate([v, lo, hi, [0.0]])
    shown = shown[np.isfinite(shown)]
    left, right = shown.min(), shown.max()
    pad = 0.08 * (right - left) if right > left else 1.0
    left, right = (left - pad if left < 0 else 0.0), right + pad
    fig = _figure(7.2, 0.4 * len(names) + 1.5)
    ax = fig.subplots()
    color = sns.color_palette("colorblind")[0]
    numbers = ax.get_yaxis_transform()  # x in axes fraction, y in data
    for i in range(len(names)):
        if np.isposinf(v[i]):
            ax.barh(i, right, color="none", edgecolor=color, hatch="//", height=0.6)
            ax.text(right, i, "never ", va="center", ha="right", fontsize="small")
        elif np.isfinite(v[i]):
            ax.barh(i, v[i], color=color, alpha=0.85, height=0.6)
        if np.isfinite(v[i]) and np.isfinite(lo[i]):
            end = hi[i] if np.isfinite(hi[i]) else right
            ax.plot([lo[i], end], [i, i], color="0.1", lw=1.2)
            ax.plot([lo[i]], [i], color="0.1", marker="|", ms=8)
            ax.plot([end], [i], color="0.1", marker="|" if np.isfinite(hi[i]) else ">", ms=7)
        text = "n/a" if np.isnan(v[i]) else _fmt(v[i], percent)
        if np.isfinite(v[i]) and not (np.isnan(lo[i]) and np.isnan(hi[i])):
            text += f"  [{_fmt(lo[i], percent)}, {_fmt(hi[i], percent)}]"
        ax.text(1.02, i, text, transform=numbers, va="center", ha="left", fontsize="small")
    ax.axvline(0, color="0.2", lw=0.8)
    ax.set_yticks(np.arange(len(names)), names)
    ax.set_xlim(left, right)
    ax.set_ylim(len(names) - 0.4, -0.6)  # first row on top
    if percent:
        ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel(xlabel or stat_label(value))
    ax.grid(axis="y", visible=False)
    fig.suptitle(title or f"{value} with interval", x=0.01, ha="left")
    return fig


@_styled
def gnr_curves(
    metrics: pd.DataFrame,
    runs: pd.DataFrame | None = None,
    *,
    by: str = "cell",
    agg: str = "median",
    labels: Mapping[str, str] | None = None,
) -> Figure:
    """Gradient-to-noise ratio ||g|| / ||g_q - g|| per layer over steps, against sqrt(3).

    Chmiel et al. 2025 (arXiv 2505.19115): once the ratio falls below sqrt(3) quantized training
    stops making progress. One panel per cell (with `runs`; else one panel), one line per layer
    coloured by depth (dark = first layer), the median over the cell's seeds; log y axis. An
    infinite ratio (g_q == g: the layer is not quantized) is left out.

    Args:
      metrics: the long metrics table. runs: the runs table, for panels per cell.
      by: the runs column naming the panels. agg: a pandas reduction over seeds.
      labels: {cell name: readable name} for the panel titles (default `labels.cell_label`).
    """
    require_tables("gnr_curves", metrics=metrics, runs=runs, needs=("run_id", by))
    tele = frames.grad_telemetry(metrics)
    tele = tele[tele["stat"] == "gnr"]
    if tele.empty:
        raise ValueError("no gradient-to-noise ratio (grad/<layer>/gnr) in the metrics")
    tele = tele.assign(value=_finite(tele["value"]))
    if runs is not None:
        tele = frames.attach(tele, runs, [by])
        panels = [c for c in _cells(runs, by) if c in set(tele[by])]
    else:
        tele, panels = tele.assign(**{by: "all runs"}), ["all runs"]
    layers = frames.layer_order(tele.loc[tele["value"].notna(), "layer"], frames.depths(metrics))
    colors = dict(zip(layers, sns.color_palette("mako", len(layers)), strict=True))
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = _figure(4.2 * ncols + 1.6, 3.2 * nrows + 0.4)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    for ax, panel in zip(axes.flat, panels, strict=False):
        sub = tele[tele[by] == panel].groupby(["layer", "step"])["value"].agg(agg).dropna()
        for layer, line in sub.groupby(level="layer"):
            ax.plot(line.index.get_level_values("step"), line, color=colors[layer], lw=1.2)
        ax.axhline(SQRT3, color="#c0392b", ls="--", lw=1.2)
        ax.set_yscale("log")
        ax.set_title(cell_label(panel, labels, by=by))
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    for ax in axes[:, 0]:
        ax.set_ylabel("‖g‖ / ‖g_q − g‖")
    named = layers if len(layers) <= 12 else [layers[0], layers[len(layers) // 2], layers[-1]]
    handles = [Line2D([], [], color=colors[layer], lw=1.2, label=layer) for layer in named]
    handles.append(Line2D([], [], color="#c0392b", ls="--", label="√3 (Chmiel et al. 2025)"))
    if not layers:
        handles.append(Line2D([], [], ls="none", label="no quantization noise (g_q = g)"))
    fig.legend(handles=handles, loc="outside right upper", fontsize="small", frameon=False)
    fig.suptitle("gradient-to-noise ratio per layer (median over seeds)")
    return fig


@_styled
def format_staircase(
    frame: pd.DataFrame,
    *,
    x: str = "scale",
    y: str = "rel_err",
    hue: str = "format",
) -> Figure:
    """Quantization error against the scale of the input, one line per format.

    Expects a precomputed frame (e.g. one row per format and input scale, with the relative
    error of quantizing scale * x for a fixed x). Per-tensor formats without a scale show
    their staircase here: flat inside the range, stepping up as values flush or saturate. Log
    axes where the data allow.
    """
    require(frame, (x, y, hue), "format_staircase", "frame")
    fig = _figure(6.4, 4.2)
    ax = fig.subplots()
    palette = sns.color_palette("colorblind")
    markers = "osD^v<>Xph"
    for i, (name, rows) in enumerate(frame.groupby(hue, sort=False)):
        rows = rows.sort_values(x)
        ax.plot(
            rows[x],
            rows[y],
            color=palette[i % len(palette)],
            marker=markers[i % 10],
            ms=3.5,
            lw=1.3,
            ls=_LINESTYLES[(i // len(palette)) % 4],
            label=str(name),
        )
    if (frame[x] > 0).all():
        ax.set_xscale("log")
    if (frame[y] > 0).all():
        ax.set_yscale("log")
    ax.set_xlabel(f"input {x}")
    ax.set_ylabel(stat_label(y))
    ax.set_title(f"{stat_label(y, unit=False)} against input {x}")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return fig


# ---------------------------------------------------------------------------------------------
# The standard set.


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", str(text)).strip("_") or "all"


def iter_figures(results, labels: Mapping[str, str] | None = None) -> Iterator[tuple[str, Figure]]:
    """(name, figure) of the standard set, lazily; figures whose data is absent are skipped.

    Names are unique (a suffix _2, _3 ... where two cells give the same file name) and keep the
    cells' own names (heatmap_rel_err_recipe_nvfp4); the figures show them in words
    (`labels.cell_label`), or as `labels` ({cell name: readable name}) names them.

    loss and eval_loss curves; ladders of divergence rate, loss gap, tokens to target and
    overhead against `analysis.default_baseline`; each factor's share of the loss gap's variance;
    heatmaps of rel_err and bias per cell; the gradient-to-noise ratio.
    """
    need = ("run_id", "cell", "status", "diverged", "loss_floor")
    require_tables("iter_figures", metrics=results.metrics, runs=results.runs, needs=need)
    seen: dict[str, int] = {}
    for name, fig in _figures(results.runs, results.metrics, labels):
        seen[name] = seen.get(name, 0) + 1
        yield (name if seen[name] == 1 else f"{name}_{seen[name]}"), fig


def _labelled(table: pd.DataFrame, count: str, word: str, labels) -> pd.DataFrame:
    """The table with a `label` column: the cell in words, and "(k word)" where the count k is
    nonzero."""
    names = [cell_label(c, labels) for c in table["cell"]]
    pairs = zip(names, table[count], strict=True)
    return table.assign(label=[f"{c} ({k} {word})" if k else c for c, k in pairs])


def _quantized_values(metrics: pd.DataFrame, stat: str, kind: str) -> pd.Series:
    """Every run's values of a quantizer or drift statistic, less those of operands a run left
    unquantized (`_unquantized`): what one colour scale for all cells must span."""
    if kind == "acc":
        tele = frames.acc_telemetry(metrics)
        return tele.loc[tele["stat"] == stat, "value"]
    tele = frames.quant_telemetry(metrics)
    quantized = ~_unquantized(tele, by=["run_id"])
    return tele.loc[quantized & (tele["stat"] == stat), "value"]


def _figures(
    runs: pd.DataFrame, metrics: pd.DataFrame, labels: Mapping[str, str] | None = None
) -> Iterator[tuple[str, Figure]]:
    if runs.empty:
        return
    ok = runs[runs["status"] == "ok"]
    names = set(metrics["metric"].unique())

    def known(column: str) -> bool:
        return bool(np.isfinite(ok[column].astype(np.float64)).any())

    floors = ok["loss_floor"].astype(np.float64) if "loss_floor" in ok else pd.Series([])
    gap = bool(len(floors)) and bool(np.isfinite(floors).all())  # the gap to the optimum, log y
    for metric in ("loss", "eval_loss"):
        points = metrics.loc[metrics["metric"] == metric].groupby("run_id").size()
        if len(points) and points.max() >= 2:  # a curve needs two points; else the ladders say it
            fig = loss_curves(runs, metrics, metric=metric, gap=gap, labels=labels)
            yield f"{metric}_curves", fig
    failed = (runs["status"] != "ok").any() or ok["diverged"].astype(bool).any()
    if len(ok) and failed:  # nothing diverged: no figure of zeros
        rates = tables.divergence_rate(runs)
        cols = zip(rates["cell"], rates["diverged"], rates["n"], strict=True)
        rates["label"] = [f"{cell_label(c, labels)} ({d}/{n})" for c, d, n in cols]
        title = "divergence rate per cell (Wilson 95% interval)"
        xlabel = "fraction of seeds diverged"
        fig = ladder(rates, "rate", label="label", percent=True, title=title, xlabel=xlabel)
        yield "divergence_rate", fig
    if known("loss_gap"):
        title = "final loss - floor (mean over seeds, seeds as random effects, 95%)"
        gaps = _labelled(tables.loss_gap(runs), "nonfinite", "non-finite", labels)
        xlabel = stat_label("loss_gap", task=_task(ok))
        yield "loss_gap", ladder(gaps, "gap", label="label", title=title, xlabel=xlabel)
    if known("target_loss"):
        base, match = tables.default_baseline(ok)
        table = _labelled(
            tables.tokens_to_target(runs, baseline=base, match=match), "never", "never", labels
        )
        title = "tokens to target (median over seeds, bootstrap 95%)"
        yield "tokens_to_target", ladder(table, "tokens", label="label", title=title)
        if base is not None:
            against = cell_label(base["recipe"], by="recipe")
            title = f"extra tokens to target against {against} (bootstrap 95%)"
            fig = ladder(table, "overhead", label="label", percent=True, title=title)
            yield "overhead", fig
    outcome = "loss_gap" if known("loss_gap") else "final_loss"
    swept = factors.design_factors(ok)
    if swept and np.isfinite(ok[outcome].astype(np.float64)).sum() >= 2:
        # design factors only: seed streams are random effects (analysis.variance_components)
        shares = factors.variance_decomposition(runs, outcome, swept)
        if shares.attrs["df_res"] > 0:
            what = stat_label(outcome, unit=False)
            title = f"share of the variance of the {what} by design factor (ω², 95%)"
            fig = ladder(shares, "share", label="factor", percent=True, title=title)
            yield f"variance_{outcome}", fig
    quant = {n.split("/")[-1] for n in names if n.startswith("quant/")}
    drift = {n.split("/")[-1] for n in names if n.startswith("acc/")}
    heatmaps = [(s, "quant") for s in ("rel_err", "bias") if s in quant]
    heatmaps += [(s, "acc") for s in ("rel_drift",) if s in drift]
    for stat, kind in heatmaps:
        # one colour scale for every cell of a statistic, so the cells compare
        norm = heatmap_norm(_quantized_values(metrics, stat, kind), stat)
        for cell in _cells(runs, "cell"):
            try:
                fig = gradient_flow_heatmap(
                    metrics, stat, runs=runs, cell=cell, kind=kind, norm=norm, labels=labels
                )
            except ValueError:  # no telemetry in this cell, or nothing quantized
                continue
            yield f"heatmap_{stat}_{_slug(cell)}", fig
    if "rel_drift" in drift:
        yield "drift_vs_depth", drift_vs_depth(metrics, runs, labels=labels)
    if any(n.startswith("grad/") and n.endswith("/gnr") for n in names):
        yield "gradient_to_noise", gnr_curves(metrics, runs, labels=labels)


def standard_figures(results, out_dir, labels: Mapping[str, str] | None = None) -> list[Path]:
    """Writes the standard figures of a results object (.runs, .metrics) as PNGs.

    Args:
      results: anything with the store's `runs` and `metrics` DataFrames.
      out_dir: the folder to write into (created if missing).
      labels: {cell name: readable name} overriding `labels.cell_label` in the figures.
    Returns:
      The paths written, in order. Figures whose data is absent (no telemetry, no target, a
      single recipe) are skipped without error.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for name, fig in iter_figures(results, labels):
        path = out / f"{name}.png"
        fig.savefig(path, dpi=DPI)
        paths.append(path)
    return paths
