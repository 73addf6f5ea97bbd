"""Curves over training steps: the loss per cell, the gradient-to-noise ratio per layer."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from fp4lab.analysis import frames
from fp4lab.analysis.columns import require_tables
from fp4lab.analysis.labels import cell_label, stat_label
from fp4lab.analysis.plots.style import LINESTYLES, cells_of, finite_values, new_figure, styled
from fp4lab.schema import SQRT3


@styled
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
    curves = curves.assign(value=finite_values(curves["value"]))
    fig = new_figure(7.0, 4.2)
    ax = fig.subplots()
    palette = sns.color_palette("colorblind")
    cells = [c for c in cells_of(runs, by) if c in set(curves[by])]
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
        color, ls = palette[i % len(palette)], LINESTYLES[(i // len(palette)) % 4]
        ax.plot(wide.index, wide.median(axis=1), color=color, ls=ls, lw=1.6, label=label)
        ax.fill_between(wide.index, lo, hi, color=color, alpha=0.18, lw=0)
    floors = runs["loss_floor"].dropna().unique()
    if not gap and len(floors) == 1 and np.isfinite(floors[0]):
        ax.axhline(floors[0], color="0.25", ls="--", lw=1, label="loss floor (optimum)")
    if gap and (curves["value"] > 0).any():
        ax.set_yscale("log")
    ax.set_xlabel("step")
    name = stat_label(metric, unit=False)
    unit = stat_label(metric, task=task_of(runs)).removeprefix(name)  # " (nats)" for an LM
    ax.set_ylabel(f"{name} − floor{unit}" if gap else f"{name}{unit}")
    what = "min–max" if band == "minmax" else "interquartile range"
    ax.set_title(f"{name}: median over seeds, band = {what}")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return fig


def task_of(runs: pd.DataFrame) -> str | None:
    """The runs' task when they share one (it sets the unit of a loss), else None."""
    tasks = runs["task"].dropna().unique() if "task" in runs else []
    return str(tasks[0]) if len(tasks) == 1 else None


@styled
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
    tele = tele.assign(value=finite_values(tele["value"]))
    if runs is not None:
        tele = frames.attach(tele, runs, [by])
        panels = [c for c in cells_of(runs, by) if c in set(tele[by])]
    else:
        tele, panels = tele.assign(**{by: "all runs"}), ["all runs"]
    layers = frames.layer_order(tele.loc[tele["value"].notna(), "layer"], frames.depths(metrics))
    colors = dict(zip(layers, sns.color_palette("mako", len(layers)), strict=True))
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = new_figure(4.2 * ncols + 1.6, 3.2 * nrows + 0.4)
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
