"""Crossed seed streams as random effects: the layout, mean squares and generalized intervals.

A cell of a sweep runs the product of its init, data and quant seeds. Each stream's seeds are
a random sample of that stream's levels, and the streams are crossed, so the runs of a cell are
not independent draws: two runs that share an init seed share its effect. With one run per
combination of the varying streams A, B, C (levels a, b, c) the model is

    y_ijk = mu + A_i + B_j + C_k + AB_ij + AC_ik + BC_jk + e_ijk,    all terms independent
    normal with variances s2_A, ..., s2_e (ABC cannot be told from e: it is the residual).

Balanced mean squares (Searle, Casella & McCulloch 1992, ch. 4) have expectations
E[MS_S] = sum over T containing S of (N / prod_{f in T} n_f) s2_T, so each component is a
signed sum of mean squares (Moebius inversion; e.g. s2_A = (MS_A - MS_AB - MS_AC + MS_E)/(bc)),
and the variance of the cell mean is Var(ybar) = sum_S s2_S / prod_{f in S} n_f.

Intervals are generalized confidence intervals (Weerahandi 1993, JASA 88:899; Hannig, Iyer &
Patterson 2006, JASA 101:254): under the model MS_S ~ E[MS_S] chi2(df_S)/df_S independently,
so R_S = MS_S df_S / U_S with U_S ~ chi2(df_S) is a pivot for E[MS_S]; each component, share
and the mean are computed from draws of R (components truncated at 0) and the interval is the
quantiles of those draws. Why these: they use the exact chi-square law of each mean square, so
they stay honest with 3-8 levels per stream where percentile bootstraps of variances are far
too narrow; for one stream they reduce to the t-interval of the mean; and they give intervals
for ratios (shares), as in gauge R&R studies (Burdick, Borror & Montgomery 2005, ch. 4).
Coverage is checked by simulation in tests/analysis.

Unbalanced layouts (a failed run) have no exact mean squares: the mean then gets Owen's
pigeonhole bootstrap (Owen 2007, Ann. Appl. Stat. 1:246; each stream's levels resampled
independently, a conservative variance) with a t quantile on min(levels) - 1 df.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from fp4lab.analysis.frames import ok_runs
from fp4lab.schema import STREAMS

__all__ = [
    "MIN_LEVELS",
    "Layout",
    "layout",
    "mean_squares",
    "gci_draws",
    "mean_interval",
    "finite_runs",
    "paired_layout",
]

MIN_LEVELS = 3  # fewer levels of a stream: no interval
ROUNDING = 1e-20  # a sum of squares below this fraction of the total is rounding: exactly 0
NAN = float("nan")


class Layout(NamedTuple):
    """The crossed structure of some runs.

    factors: names of the varying streams; streams that always move together (seed triples
      (i, i, i)) are one factor named "init=data=quant".
    codes: per factor, each run's level (0..n-1). levels: levels per factor.
    balanced: one run per combination of the factors' levels, every combination present.
    """

    factors: tuple[str, ...]
    codes: tuple[np.ndarray, ...]
    levels: tuple[int, ...]
    balanced: bool


def layout(rows: pd.DataFrame, streams: tuple[str, ...] = STREAMS) -> Layout:
    """The crossed layout of `rows` over the seed columns seed_<stream>.

    Args:
      rows: runs of one cell (a DataFrame with seed_init, seed_data, seed_quant columns).
      streams: the streams to read; one-level streams are left out (they do not vary).
    Returns:
      Layout with the varying, de-aliased streams.
    """
    names, codes = [], []
    for stream in streams:
        column = f"seed_{stream}"
        if column not in rows.columns:
            raise ValueError(f"layout: no column {column!r}; have {list(rows.columns)}")
        code = pd.factorize(rows[column])[0]
        if code.max(initial=0) == 0:
            continue
        same = next((i for i, c in enumerate(codes) if _same_partition(c, code)), None)
        if same is None:
            names.append(stream)
            codes.append(code)
        else:
            names[same] += f"={stream}"
    levels = tuple(int(c.max()) + 1 for c in codes)
    cells = {tuple(int(c[r]) for c in codes) for r in range(len(rows))}
    balanced = len(rows) == int(np.prod(levels)) == len(cells) and len(rows) > 1
    return Layout(tuple(names), tuple(codes), levels, balanced)


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    pairs = set(zip(a.tolist(), b.tolist(), strict=True))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def components(lay: Layout) -> list[tuple[int, ...]]:
    """Variance components of a balanced layout: every non-empty subset of the factors, as
    index tuples; the full set (last) is the residual, which it cannot be told apart from."""
    k = len(lay.factors)
    return [s for r in range(1, k + 1) for s in itertools.combinations(range(k), r)]


def component_name(lay: Layout, subset: tuple[int, ...]) -> str:
    """ "init", "init:quant", ...; the full set is "residual" when there are 2+ factors."""
    if len(subset) == len(lay.factors) and len(subset) > 1:
        return "residual"
    return ":".join(lay.factors[i] for i in subset)


def mean_squares(y: np.ndarray, lay: Layout) -> dict[tuple[int, ...], tuple[float, int]]:
    """Mean square and degrees of freedom of each component of a balanced crossed layout.

        effect_S = the S-way interaction of the table of means (centre each axis of S),
        SS_S = (N / prod_{f in S} n_f) sum effect_S^2,   df_S = prod_{f in S} (n_f - 1).

    Args:
      y: one outcome per run, in the order of the layout's codes. lay: a balanced Layout.
    Returns:
      {subset: (MS_S, df_S)} for every subset of `components(lay)`.
    """
    table = np.zeros(lay.levels)
    table[tuple(lay.codes)] = y
    n = table.size
    out = {}
    for subset in components(lay):
        others = tuple(i for i in range(len(lay.levels)) if i not in subset)
        effect = table.mean(axis=others, keepdims=True) if others else table
        for axis in subset:
            effect = effect - effect.mean(axis=axis, keepdims=True)
        size = int(np.prod([lay.levels[i] for i in subset]))
        df = int(np.prod([lay.levels[i] - 1 for i in subset]))
        out[subset] = (float((n / size) * (effect**2).sum()), df)
    # rounding leaves ~1e-35 where a stream has no effect at all (bf16 under quant seeds)
    floor = ROUNDING * sum(ss for ss, _ in out.values())
    return {s: (ss / df if ss > floor else 0.0, df) for s, (ss, df) in out.items()}


def ems_components(ms: dict[tuple[int, ...], np.ndarray], lay: Layout) -> dict:
    """Each component from mean squares by the expected mean squares (Moebius inversion):

        s2_S = (prod_{f in S} n_f / N) * sum_{T containing S} (-1)^(|T|-|S|) MS_T.

    Works elementwise, so MS values may be arrays of draws. Not truncated: may be negative.
    """
    n = int(np.prod(lay.levels))
    out = {}
    for s in ms:
        coef = np.prod([lay.levels[i] for i in s]) / n
        out[s] = coef * sum((-1) ** (len(t) - len(s)) * ms[t] for t in ms if set(s) <= set(t))
    return out


def gci_draws(y: np.ndarray, lay: Layout, *, draws: int = 4000, seed: int = 0) -> dict:
    """Generalized pivotal draws of every component, the shares and the cell mean.

        R_S = MS_S df_S / U_S,  U_S ~ chi2(df_S);   s2_S* = max(0, EMS inversion of R);
        share_S* = s2_S* / sum_T s2_T*;   mu* = ybar - Z sqrt(sum_S s2_S* / prod_{f in S} n_f).

    Args:
      y: outcomes in layout order. lay: a balanced Layout. draws: Monte Carlo size.
      seed: seed of numpy's PCG64 (the same call gives the same draws).
    Returns:
      {"variance": {subset: (draws,)}, "share": {subset: (draws,)}, "mean": (draws,)}.
    """
    rng = np.random.default_rng(seed)
    ms = mean_squares(y, lay)
    pivots = {s: m * d / rng.chisquare(d, draws) for s, (m, d) in ms.items()}
    variance = {s: np.maximum(v, 0.0) for s, v in ems_components(pivots, lay).items()}
    total = sum(variance.values())
    with np.errstate(invalid="ignore", divide="ignore"):
        share = {s: v / total for s, v in variance.items()}
    var_mean = sum(v / np.prod([lay.levels[i] for i in s]) for s, v in variance.items())
    mean = float(np.mean(y)) - rng.standard_normal(draws) * np.sqrt(var_mean)
    return {"variance": variance, "share": share, "mean": mean}


def quantiles(draws: np.ndarray, level: float) -> tuple[float, float]:
    """The (1-level)/2 and (1+level)/2 quantiles of generalized pivotal draws."""
    alpha = (1 - level) / 2
    if np.all(np.isnan(draws)):  # e.g. shares of an outcome that never varies
        return NAN, NAN
    lo, hi = np.nanquantile(draws, [alpha, 1 - alpha])
    return float(lo), float(hi)


class MeanInterval(NamedTuple):
    """Mean over a crossed layout, its interval, and how the interval was made (or why not)."""

    estimate: float
    lo: float
    hi: float
    method: str


def mean_interval(
    y: np.ndarray, lay: Layout, *, level: float = 0.95, draws: int = 4000, seed: int = 0
) -> MeanInterval:
    """Interval of the mean of y over a crossed layout, seed levels as random effects.

    Balanced: the generalized interval of `gci_draws` (one factor: the t-interval). Unbalanced:
    pigeonhole bootstrap standard error (Owen 2007) times t(min levels - 1). Any factor with
    fewer than MIN_LEVELS levels (or no varying factor): no interval, method says why.

    Args:
      y: outcomes in layout order. lay: its Layout. level: coverage. draws: Monte Carlo size
        (generalized draws or bootstrap resamples). seed: the Monte Carlo seed.
    Returns:
      MeanInterval(mean, lo, hi, method): method "generalized", "t", "pigeonhole", or
      "too few seeds (...)".
    """
    y = np.asarray(y, np.float64)
    estimate = float(np.mean(y)) if y.size else NAN
    fewest = min(lay.levels, default=1)
    if fewest < MIN_LEVELS:
        return MeanInterval(estimate, NAN, NAN, f"too few seeds ({fewest} level(s); need 3)")
    if len(lay.factors) == 1 and lay.balanced:
        half = scipy_stats.t.ppf(0.5 + level / 2, y.size - 1) * y.std(ddof=1) / np.sqrt(y.size)
        return MeanInterval(estimate, estimate - half, estimate + half, "t")
    if lay.balanced:
        lo, hi = quantiles(gci_draws(y, lay, draws=draws, seed=seed)["mean"], level)
        return MeanInterval(estimate, lo, hi, "generalized")
    rng = np.random.default_rng(seed)
    weight = np.ones((draws, y.size))
    for code, n in zip(lay.codes, lay.levels, strict=True):
        weight *= rng.multinomial(n, np.full(n, 1 / n), size=draws)[:, code]
    with np.errstate(invalid="ignore", divide="ignore"):
        boots = (weight * y).sum(1) / weight.sum(1)
    half = scipy_stats.t.ppf(0.5 + level / 2, fewest - 1) * np.nanstd(boots, ddof=1)
    return MeanInterval(estimate, estimate - half, estimate + half, "pigeonhole")


def paired_layout(a: pd.DataFrame, b: pd.DataFrame, outcome: str, streams: Sequence[str]):
    """Differences b - a on the seeds two cells share, as a crossed layout.

    Paired streams are those that both cells vary (2+ levels each) and that share a level;
    each cell is first averaged over its other streams (a cell with quant seeds 0-4 against
    one with quant seed 0 only is paired on init and data, the first averaged over its quant
    seeds), then the cells are matched on the combinations of paired seeds both have:

        d_s = mean of y_b over its unpaired streams at s - the same for a,   s: shared seeds.

    Args:
      a, b: runs of two cells. outcome: the column compared. streams: the seed streams.
    Returns:
      (d, Layout), or (None, None) when the cells share no varying stream.
    """
    a, b = finite_runs(a, outcome), finite_runs(b, outcome)
    paired = []
    for s in streams:
        col_a, col_b = a[f"seed_{s}"], b[f"seed_{s}"]
        if col_a.nunique() > 1 and col_b.nunique() > 1 and set(col_a) & set(col_b):
            paired.append(s)
    if not paired:
        return None, None
    cols = [f"seed_{s}" for s in paired]
    diff = b.groupby(cols)[outcome].mean() - a.groupby(cols)[outcome].mean()
    diff = diff.dropna().reset_index()
    return diff[outcome].to_numpy(np.float64), layout(diff, tuple(paired))


def finite_runs(rows: pd.DataFrame, outcome: str) -> pd.DataFrame:
    """The runs with status "ok" and a finite outcome: the ones an outcome's statistics use."""
    ok = ok_runs(rows)
    return ok[np.isfinite(ok[outcome].astype(np.float64).to_numpy())]
