"""Which GEMMs to keep in high precision: a layer x GEMM heatmap of a sensitivity score."""

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
    table: pd.DataFrame, score: str, chosen: Iterable[tuple[str, str]] = (), *, title: str = ""
):
    """Layers (rows, by `depth`) x GEMMs (Fprop, Dgrad, Wgrad) coloured by `score`, with the
    cells of `chosen` [(layer, gemm)] outlined (the recommended set).

    Args:
      table: one row per layer and GEMM with columns layer, gemm, depth and `score`
        (`fp4lab.diagnose`'s ranked table).
      score: the column drawn (higher = more sensitive).
      chosen: the (layer, gemm) pairs to outline.
      title: the figure's title (default: the score's name).
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
    fig = new_figure(4.2 + 0.2 * max(len(l) for l in layers) / 4, 1.2 + 0.28 * len(layers))
    ax = fig.add_subplot()
    finite = values[np.isfinite(values)]
    vmax = float(finite.max()) if finite.size else 1.0
    vmin = min(0.0, float(finite.min())) if finite.size else 0.0
    image = ax.imshow(values, aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax or 1.0)
    fig.colorbar(image, ax=ax, label=score)
    ax.set_xticks(range(len(GEMMS)), [g.capitalize() for g in GEMMS])
    ax.set_yticks(range(len(layers)), layers)
    ax.grid(False)
    rows, cols = {l: i for i, l in enumerate(layers)}, {g: j for j, g in enumerate(GEMMS)}
    for layer, gemm in chosen:
        ax.add_patch(
            Rectangle(
                (cols[gemm] - 0.5, rows[layer] - 0.5), 1, 1, fill=False, edgecolor="red", lw=2.2
            )
        )
    ax.set_title(title or f"{score} (outlined: kept in high precision)")
    return fig
