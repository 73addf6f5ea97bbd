"""Which GEMMs to keep in high precision: a layer x GEMM heatmap of a sensitivity score, beside
the first entries of the ranking with their intervals, on one scale."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
from matplotlib.patches import Rectangle

from fp4lab.analysis.plots.style import new_figure, styled
from fp4lab.schema import GEMMS

__all__ = ["sensitivity_heatmap"]


@styled
def sensitivity_heatmap(
    table: pd.DataFrame,
    score: str,
    chosen: Iterable[tuple[str, str]] = (),
    *,
    title: str = "",
    scale: tuple[float, float] | None = None,
    top: int = 12,
):
    """Layers (rows, by `depth`) x GEMMs (Fprop, Dgrad, Wgrad) coloured by `score`, with the
    cells of `chosen` [(layer, gemm)] outlined (the recommended set); beside it, when the table
    has `<score>_lo` and `<score>_hi`, the `top` highest entries with their intervals (chosen
    ones in red).

    Args:
      table: one row per layer and GEMM with columns layer, gemm, depth and `score`
        (`fp4lab.diagnosis`'s ranked table).
      score: the column drawn (higher = more sensitive).
      chosen: the (layer, gemm) pairs to outline.
      title: the figure's title (default: the score's name).
      scale: (low, high) of the colour scale and the intervals' axis, the same for every
        model (a score that is a share: (0, 1)); None: the table's own range (not comparable
        across models). Values outside are drawn at the ends.
      top: how many entries the interval panel shows.
    Returns:
      A matplotlib Figure.
    """
    missing = [c for c in ("layer", "gemm", "depth", score) if c not in table.columns]
    if missing:
        raise KeyError(f"sensitivity_heatmap: the table has no column(s) {missing}")
    layers = table.drop_duplicates("layer").sort_values("depth", kind="stable")["layer"].tolist()
    grid = table.pivot(index="layer", columns="gemm", values=score).reindex(
        index=layers, columns=list(GEMMS)
    )
    values = grid.to_numpy(np.float64)
    bands = {f"{score}_lo", f"{score}_hi"} <= set(table.columns)
    fig = new_figure(
        4.2 + 0.2 * max(len(l) for l in layers) / 4 + 3.6 * bands, 1.2 + 0.28 * len(layers)
    )
    ax = fig.add_subplot(1, 2 if bands else 1, 1)
    finite = values[np.isfinite(values)]
    if scale is None:
        vmax = float(finite.max()) if finite.size else 1.0
        vmin = min(0.0, float(finite.min())) if finite.size else 0.0
        scale = (vmin, vmax or 1.0)
    image = ax.imshow(values, aspect="auto", cmap="viridis", vmin=scale[0], vmax=scale[1])
    fig.colorbar(image, ax=ax, label=score)
    ax.set_xticks(range(len(GEMMS)), [g.capitalize() for g in GEMMS])
    ax.set_yticks(range(len(layers)), layers)
    ax.grid(False)
    rows, cols = {l: i for i, l in enumerate(layers)}, {g: j for j, g in enumerate(GEMMS)}
    chosen = list(chosen)
    for layer, gemm in chosen:
        ax.add_patch(
            Rectangle(
                (cols[gemm] - 0.5, rows[layer] - 0.5), 1, 1, fill=False, edgecolor="red", lw=2.2
            )
        )
    ax.set_title(title or f"{score} (outlined: kept in high precision)")
    if bands:
        _intervals(fig.add_subplot(1, 2, 2), table, score, set(chosen), scale, top)
    return fig


def _intervals(ax, table: pd.DataFrame, score: str, chosen: set, scale, top: int) -> None:
    """The `top` highest entries of `score`, each with its interval, on the scale `scale`."""
    first = table.sort_values(score, ascending=False, kind="stable").head(top).iloc[::-1]
    y = np.arange(len(first))
    mean = first[score].to_numpy(np.float64).clip(*scale)
    lo = first[f"{score}_lo"].to_numpy(np.float64).clip(*scale)
    hi = first[f"{score}_hi"].to_numpy(np.float64).clip(*scale)
    kept = [(l, g) in chosen for l, g in zip(first["layer"], first["gemm"], strict=True)]
    colors = np.where(kept, "tab:red", "tab:blue")
    has = np.isfinite(lo) & np.isfinite(hi)
    ax.hlines(y[has], lo[has], hi[has], colors=colors[has], lw=2)
    ax.scatter(mean, y, c=colors, zorder=3, s=18)
    labels = [f"{l} {g.capitalize()}" for l, g in zip(first["layer"], first["gemm"], strict=True)]
    ax.set_yticks(y, labels)
    ax.set_xlim(*scale)
    ax.set_xlabel(score)
    ax.set_title(f"first {len(first)}, intervals (red: kept)")
