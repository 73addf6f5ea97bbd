"""Heatmaps of telemetry over layers and steps, and the accumulated drift against depth."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import colors as mcolors
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from fp4lab.analysis import frames
from fp4lab.analysis.columns import require_tables
from fp4lab.analysis.labels import cell_label, stat_label
from fp4lab.analysis.plots.style import (
    HATCHED,
    LINESTYLES,
    NON_FINITE,
    SIGNED,
    cell_edges,
    cells_of,
    finite_values,
    heatmap_norm,
    new_figure,
    select_cell,
    styled,
    telemetry_kind,
)
from fp4lab.schema import ACC_OPERANDS, ACC_STATS, GEMMS, OPERANDS

DIRECTION_TITLES = {
    ("fwd", "rel_drift"): "forward: output y, accumulated drift",
    ("fwd", "local"): "forward: output y, the op's own error",
    ("bwd", "rel_drift"): "backward: cotangent dy, accumulated drift",
    ("bwd", "cos"): "backward: cotangent dy, cosine",
}


def unquantized(tele: pd.DataFrame, by: Sequence[str] = ()) -> pd.Series:
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


def depth_layers(metrics: pd.DataFrame, runs: pd.DataFrame | None, cell: str | None) -> set:
    """The layers of the selected runs' `depth/<layer>` rows: every measured op the forward ran
    through, whatever telemetry it has."""
    rows = select_cell(metrics[metrics["metric"].str.startswith("depth/")], runs, cell)
    return set(rows["metric"].str.removeprefix("depth/"))


def hatch(ax, x_edges: np.ndarray, missing: np.ndarray) -> None:
    """Hatched rectangles over the True cells of `missing` (layers x steps, row i spanning
    y in [i, i+1]), one rectangle per run of adjacent cells in a row."""
    for row, line in enumerate(missing):
        change = np.diff(np.concatenate([[0], line.astype(int), [0]]))
        for a, b in zip(np.flatnonzero(change == 1), np.flatnonzero(change == -1), strict=True):
            ax.add_patch(Rectangle((x_edges[a], row), x_edges[b] - x_edges[a], 1, **HATCHED))


@styled
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
    kind = telemetry_kind(stat, kind)
    if kind == "grad":
        tele = frames.grad_telemetry(metrics)
    elif kind == "acc":
        tele = frames.acc_telemetry(metrics).rename(columns={"direction": "gemm"})
        tele = tele.assign(operand=tele["gemm"].map(ACC_OPERANDS))
    else:
        tele = frames.quant_telemetry(metrics)
    tele = select_cell(tele, runs, cell)
    if not (tele["stat"] == stat).any():
        raise ValueError(f"no {kind} telemetry for statistic {stat!r}")
    named = set(tele["layer"])
    if kind != "grad":  # op paths, as depth/ names them (grad/ names parameters)
        named |= depth_layers(metrics, runs, cell)
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
        titles = {(d, ACC_OPERANDS[d]): DIRECTION_TITLES[d, stat] for d in have}
    else:
        have = set(zip(tele["gemm"], tele["operand"], strict=True))
        gemms = [g for g in GEMMS if any((g, o) in have for o in OPERANDS[g])]
        panels = [[(g, OPERANDS[g][i]) for g in gemms] for i in (0, 1)]
        titles = {(g, o): f"{g} · {o}" for g in gemms for o in OPERANDS[g]}
        tele = tele[~unquantized(tele)]  # no value: hatched below, never the colour of 0
    tele = tele[tele["stat"] == stat]
    if tele.empty:
        raise ValueError(f"no quantized operand in the telemetry of {stat!r}: none to draw")
    tele = tele.assign(value=finite_values(tele["value"]))
    grouped = tele.groupby(["gemm", "operand", "layer", "step"])["value"]
    grid = pd.DataFrame({"value": grouped.agg(agg), "rows": grouped.size()}).reset_index()
    norm = norm or heatmap_norm(grid["value"], stat)
    name = "rocket" if stat == "cos" else "rocket_r"  # dark = worse
    cmap = sns.color_palette("vlag" if stat in SIGNED else name, as_cmap=True)
    cmap = cmap.with_extremes(bad=NON_FINITE)
    nrows, ncols = len(panels), len(panels[0])
    height = max(2.2, 0.16 * len(layers) + 1.2)
    fig = new_figure(3.4 * ncols + 1.2 + (1.0 if kind == "acc" else 0.0), height * nrows + 0.7)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    x_edges = cell_edges(steps.astype(float))
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
            hatch(ax, x_edges, missing)
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
    handles = [Patch(**(HATCHED | {"lw": 0.5}), label="not quantized")] if hatched else []
    handles += [Patch(facecolor=NON_FINITE, label="no finite value")] if non_finite else []
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)
    what = stat_label(stat, kind=kind, unit=False)
    fig.suptitle(f"{what} by layer and step" + (f" — {cell_label(cell, labels)}" if cell else ""))
    return fig


@styled
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
    tele = tele[tele["step"].isin(steps)].assign(value=lambda f: finite_values(f["value"]))
    if runs is not None:
        tele = frames.attach(tele, runs, [by])
        lines = [c for c in cells_of(runs, by) if c in set(tele[by])]
    else:
        tele, lines = tele.assign(**{by: "all runs"}), ["all runs"]
    layers = frames.layer_order(tele["layer"], frames.depths(metrics))
    position = {layer: i for i, layer in enumerate(layers)}
    directions = [d for d in ACC_STATS if stat in ACC_STATS[d] and d in set(tele["direction"])]
    fig = new_figure(5.0 * len(directions) + 2.4, 4.0)
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
                    style = ls if len(steps) == 1 else LINESTYLES[k % 4]
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
