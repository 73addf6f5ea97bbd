"""Bars with intervals (overhead, rates, shares) and the format staircase."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from fp4lab.analysis.columns import require
from fp4lab.analysis.labels import cell_label, stat_label
from fp4lab.analysis.plots.style import LINESTYLES, new_figure, styled


def fmt(x: float, percent: bool) -> str:
    if np.isnan(x):
        return "?"
    if np.isinf(x):
        return "∞" if x > 0 else "-∞"
    if percent:
        return f"{x:.1%}"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def bar_name(value, column: str, labels: Mapping[str, str] | None) -> str:
    """A ladder's name for a value of a label column: a cell in words, any name as `labels`
    renames it."""
    if column == "cell":
        return cell_label(value, labels)
    return str(labels[value]) if labels is not None and value in labels else str(value)


@styled
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
    texts = [[bar_name(v, col, labels) for v in table[col]] for col in cols]
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
    fig = new_figure(7.2, 0.4 * len(names) + 1.5)
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
        text = "n/a" if np.isnan(v[i]) else fmt(v[i], percent)
        if np.isfinite(v[i]) and not (np.isnan(lo[i]) and np.isnan(hi[i])):
            text += f"  [{fmt(lo[i], percent)}, {fmt(hi[i], percent)}]"
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


@styled
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
    fig = new_figure(6.4, 4.2)
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
            ls=LINESTYLES[(i // len(palette)) % 4],
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
