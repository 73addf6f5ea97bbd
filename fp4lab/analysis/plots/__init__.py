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

Modules by figure family: style (the shared style, colour scales and helpers), heatmaps,
curves, bars, standard.

Cells are named in words (`labels.cell_label`: "recipe=nvfp4,wgrad=bf16" reads "NVFP4, Wgrad
in BF16") and statistics by what they measure (`labels.stat_label`); every function that names
cells takes `labels`, a dict {cell name: readable name} that overrides the names it gives.
"""

from fp4lab.analysis.plots.bars import format_staircase, ladder
from fp4lab.analysis.plots.curves import gnr_curves, loss_curves
from fp4lab.analysis.plots.heatmaps import drift_vs_depth, gradient_flow_heatmap
from fp4lab.analysis.plots.standard import iter_figures, standard_figures
from fp4lab.analysis.plots.style import DPI, SIGNED, heatmap_norm

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
    "SIGNED",
]
