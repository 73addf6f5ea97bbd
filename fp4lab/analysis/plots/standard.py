"""The standard figures of a results object: which apply, drawn and written as PNGs."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from fp4lab.analysis import factors, frames, tables
from fp4lab.analysis.columns import require_tables
from fp4lab.analysis.labels import cell_label, stat_label
from fp4lab.analysis.plots.bars import ladder
from fp4lab.analysis.plots.curves import gnr_curves, loss_curves, task_of
from fp4lab.analysis.plots.heatmaps import drift_vs_depth, gradient_flow_heatmap, unquantized
from fp4lab.analysis.plots.style import DPI, cells_of, heatmap_norm


def slug(text: str) -> str:
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
    for name, fig in figures(results.runs, results.metrics, labels):
        seen[name] = seen.get(name, 0) + 1
        yield (name if seen[name] == 1 else f"{name}_{seen[name]}"), fig


def labelled(table: pd.DataFrame, count: str, word: str, labels) -> pd.DataFrame:
    """The table with a `label` column: the cell in words, and "(k word)" where the count k is
    nonzero."""
    names = [cell_label(c, labels) for c in table["cell"]]
    pairs = zip(names, table[count], strict=True)
    return table.assign(label=[f"{c} ({k} {word})" if k else c for c, k in pairs])


def quantized_values(metrics: pd.DataFrame, stat: str, kind: str) -> pd.Series:
    """Every run's values of a quantizer or drift statistic, less those of operands a run left
    unquantized (`unquantized`): what one colour scale for all cells must span."""
    if kind == "acc":
        tele = frames.acc_telemetry(metrics)
        return tele.loc[tele["stat"] == stat, "value"]
    tele = frames.quant_telemetry(metrics)
    quantized = ~unquantized(tele, by=["run_id"])
    return tele.loc[quantized & (tele["stat"] == stat), "value"]


def figures(
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
        gaps = labelled(tables.loss_gap(runs), "nonfinite", "non-finite", labels)
        xlabel = stat_label("loss_gap", task=task_of(ok))
        yield "loss_gap", ladder(gaps, "gap", label="label", title=title, xlabel=xlabel)
    if known("target_loss"):
        base, match = tables.default_baseline(ok)
        table = labelled(
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
            fig = ladder(drawn_shares(shares), "share", label="factor", percent=True, title=title)
            yield f"variance_{outcome}", fig
    quant = {n.split("/")[-1] for n in names if n.startswith("quant/")}
    drift = {n.split("/")[-1] for n in names if n.startswith("acc/")}
    heatmaps = [(s, "quant") for s in ("rel_err", "bias") if s in quant]
    heatmaps += [(s, "acc") for s in ("rel_drift",) if s in drift]
    for stat, kind in heatmaps:
        # one colour scale for every cell of a statistic, so the cells compare
        norm = heatmap_norm(quantized_values(metrics, stat, kind), stat)
        for cell in cells_of(runs, "cell"):
            try:
                fig = gradient_flow_heatmap(
                    metrics, stat, runs=runs, cell=cell, kind=kind, norm=norm, labels=labels
                )
            except ValueError:  # no telemetry in this cell, or nothing quantized
                continue
            yield f"heatmap_{stat}_{slug(cell)}", fig
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


def drawn_shares(shares: pd.DataFrame) -> pd.DataFrame:
    """The shares of `factors.variance_decomposition` as the figure draws them: omega^2 is an
    unbiased estimate that falls below 0 for a factor without effect (and the residual's above
    1 then); a share of variance is neither, so estimates and interval ends are clipped to
    [0, 1] and the residual is what the factors leave, 1 - their clipped shares, drawn without
    an interval (the table keeps the estimates and intervals as they are)."""
    out = shares.copy()
    for column in ("share", "share_lo", "share_hi"):
        out[column] = out[column].clip(0.0, 1.0)
    factor = out["factor"] != "residual"
    rest = 1.0 - out.loc[factor, "share"].fillna(0.0).sum()
    out.loc[~factor, "share"] = min(max(rest, 0.0), 1.0)
    out.loc[~factor, ["share_lo", "share_hi"]] = np.nan
    return out
