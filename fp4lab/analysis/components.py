"""Variance components of the crossed seed streams, per cell, with honest intervals.

The model, the estimator and the intervals are those of `fp4lab.analysis.crossed` (seeds are
random effects; expected mean squares of a balanced crossed design, or REML; generalized
confidence intervals). This module turns them into tables.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from fp4lab.analysis import crossed
from fp4lab.analysis.columns import require
from fp4lab.schema import STREAMS

__all__ = ["variance_components", "reml_components", "stream_totals", "cell_draws"]

NAN = float("nan")
METHODS = ("anova", "reml")
# the generalized interval of the full interaction's share under-covers when that term
# dominates (tests/analysis/test_coverage.py): not printed
RESIDUAL_SHARE = "no share interval for the residual (it under-covers when the residual dominates)"


def cell_draws(rows: pd.DataFrame, outcome: str, streams: Sequence[str]):
    """The ok runs of one cell with a finite outcome: (outcomes, their crossed Layout, rows).

    Args:
      rows: the runs of one cell. outcome: the column. streams: the seed streams.
    Returns:
      (y, Layout, rows), y and the Layout's codes in the order of the rows.
    """
    ok = crossed.finite_runs(rows, outcome)
    y = ok[outcome].astype(np.float64).to_numpy()
    return y, crossed.layout(ok, tuple(streams)), ok


def reml_components(y: np.ndarray, lay: crossed.Layout) -> dict[tuple[int, ...], float]:
    """REML estimates of the components of a crossed layout (statsmodels MixedLM).

    One group holds every run; each component but the residual is a variance component
    (`vc_formula`, "0 + C(init):C(quant)" and so on) and the residual is the model's scale.
    REML (Patterson & Thompson 1971) equals the ANOVA estimator on a balanced design when
    that is positive, and also works on unbalanced ones.

    Args:
      y: outcomes. lay: their Layout (two or more factors).
    Returns:
      {subset: variance} for every subset of `crossed.components(lay)`.
    """
    from statsmodels.regression.mixed_linear_model import MixedLM

    subsets = crossed.components(lay)
    frame = pd.DataFrame({f"f{i}": c for i, c in enumerate(lay.codes)})
    vc = {
        f"c{n}": ":".join(f"C(f{i})" for i in s)
        for n, s in enumerate(subsets[:-1])  # the last, full set is the residual
    }
    vc = {k: "0 + " + v for k, v in vc.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = MixedLM.from_formula(
            "y ~ 1", vc_formula=vc, re_formula="0", groups=np.zeros(len(y)), data=frame.assign(y=y)
        )
        fit = model.fit(reml=True)
    named = dict(zip(model.exog_vc.names, np.asarray(fit.vcomp, np.float64), strict=True))
    out = {s: float(named[f"c{n}"]) for n, s in enumerate(subsets[:-1])}
    out[subsets[-1]] = float(fit.scale)
    return out


def stream_totals(variance: dict, lay: crossed.Layout) -> dict[str, np.ndarray]:
    """The variance each factor induces with the others held fixed: its component and every
    interaction it is part of (the residual, the full interaction, included),

        V_f = sum_{S containing f} s2_S = E[Var(y | all other factors)].

    Args:
      variance: {subset: value or draws} as from `crossed.gci_draws`. lay: the Layout.
    Returns:
      {factor name: V_f}.
    """
    return {
        name: sum(v for s, v in variance.items() if i in s) for i, name in enumerate(lay.factors)
    }


def variance_components(
    runs: pd.DataFrame,
    outcome: str = "loss_gap",
    streams: Sequence[str] = STREAMS,
    by: str = "cell",
    *,
    method: str = "anova",
    level: float = 0.95,
    draws: int = crossed.DRAWS,
    seed: int = 0,
) -> pd.DataFrame:
    """Variance components of the seed streams of a crossed design, one table row per
    (cell, component).

    Per cell, with one run per combination of the varying streams' seeds (see
    `fp4lab.analysis.crossed` for the model): each stream, each interaction of streams, and the
    residual (the full interaction: a run is a deterministic function of its seeds, so in a
    cell with 2+ varying streams it is the highest-order interaction). Seeds are random effects.

    Estimates: "anova" (default), the expected mean squares of a balanced crossed design
    (Moebius inversion of the mean squares), truncated at 0; "reml", statsmodels' MixedLM,
    which also serves unbalanced cells. The two agree on balanced data (a test checks it).
    Intervals: generalized confidence intervals (Weerahandi 1993) from the chi-square laws of
    the mean squares, for the variance and for the share; they need a balanced cell and at
    least 3 levels of every stream involved, else NaN and a `note` says why. Chosen over a
    percentile bootstrap because with 3-8 levels a bootstrap of variances is far too narrow;
    their coverage is checked by simulation in tests/analysis.

    Args:
      runs: the runs table (only status "ok" runs with a finite outcome enter).
      outcome: the column analysed. streams: the seed streams (columns seed_<stream>).
      by: the column whose values are cells (the design's fixed factor).
      method: "anova" or "reml". level: coverage of each interval.
      draws: generalized pivotal draws. seed: their seed (same call, same intervals).
    Returns:
      DataFrame: cell, component, variance, share, lo, hi (the variance's interval), lo_mcse,
      hi_mcse (the Monte Carlo standard errors of its ends), share_lo, share_hi, share_mcse
      (the larger of its ends'), sd (sqrt variance), levels (fewest distinct seeds among the
      streams involved), df (of its mean square), n (runs), note. A stream with one level
      gets one row, "not varied"; streams that always move together are one component
      ("init=data=quant").
    """
    if method not in METHODS:
        raise ValueError(f"variance_components: method={method!r}; allowed: {METHODS}")
    need = (by, "status", outcome, *(f"seed_{s}" for s in streams))
    require(runs, need, "variance_components")
    rows = []
    for cell, group in runs.groupby(by, sort=False):
        y, lay, ok = cell_draws(group, outcome, streams)
        base = dict(cell=cell, n=len(y))
        varied = set("=".join(lay.factors).split("="))
        for stream in streams:
            if stream not in varied:
                rows.append(base | _empty(stream, 1, "not varied (1 level)"))
        if not lay.factors:
            continue
        rows += [base | r for r in _cell_rows(y, lay, method, level, draws, seed)]
    columns = ["cell", "component", "variance", "share", "lo", "hi", "lo_mcse", "hi_mcse"]
    columns += ["share_lo", "share_hi", "share_mcse", "sd", "levels", "df", "n", "note"]
    out = pd.DataFrame(rows, columns=columns)
    out.attrs = dict(outcome=outcome, method=method, level=level, interval="generalized")
    return out


def _empty(component: str, levels: int, note: str) -> dict:
    values = dict(variance=NAN, share=NAN, lo=NAN, hi=NAN, share_lo=NAN, share_hi=NAN, sd=NAN)
    values |= dict(lo_mcse=NAN, hi_mcse=NAN, share_mcse=NAN)
    return dict(component=component, levels=levels, df=0, note=note) | values


def _cell_rows(y, lay, method, level, draws, seed) -> list[dict]:
    """The component rows of one cell."""
    subsets = crossed.components(lay)
    if lay.balanced:
        ms = crossed.mean_squares(y, lay)
        raw = crossed.ems_components({s: m for s, (m, _) in ms.items()}, lay)
        gci = crossed.gci_draws(y, lay, draws=draws, seed=seed)
    else:
        ms, raw, gci = {}, {}, None
    if method == "reml" and len(lay.factors) > 1:
        raw = reml_components(y, lay)
    estimate = {s: max(float(raw[s]), 0.0) if s in raw else NAN for s in subsets}
    total = sum(estimate.values())
    rows = []
    for s in subsets:
        levels = min(lay.levels[i] for i in s)
        note = "" if lay.balanced else "unbalanced: no interval (method='reml' estimates)"
        if s in raw and raw[s] < 0:
            note = f"estimate {raw[s]:.3g} < 0, set to 0"
        ends = share_ends = crossed.Ends(NAN, NAN, NAN, NAN)
        if levels < crossed.MIN_LEVELS:
            note = f"too few seeds ({levels} levels; need {crossed.MIN_LEVELS})"
        elif gci is not None:
            ends = crossed.quantile_ends(gci["variance"][s], level)
            if crossed.component_name(lay, s) == "residual":
                note = (note + "; " if note else "") + RESIDUAL_SHARE
            else:
                share_ends = crossed.quantile_ends(gci["share"][s], level)
        rows.append(
            dict(component=crossed.component_name(lay, s), variance=estimate[s])
            | dict(share=estimate[s] / total if total > 0 else NAN, lo=ends.lo, hi=ends.hi)
            | dict(lo_mcse=ends.lo_se, hi_mcse=ends.hi_se)
            | dict(share_lo=share_ends.lo, share_hi=share_ends.hi)
            | dict(share_mcse=max(share_ends.lo_se, share_ends.hi_se), sd=np.sqrt(estimate[s]))
            | dict(levels=levels, df=ms[s][1] if s in ms else 0, note=note)
        )
    return rows
