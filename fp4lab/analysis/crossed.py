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
Coverage of every printed interval is checked by simulation in tests/analysis.

A stream's own variance and the shared term. With 2+ varying factors the full interaction (the
residual) belongs to every factor at once: with one run per seed combination it cannot be told
apart from run-to-run noise, and since runs are deterministic functions of their seeds it is a
real interaction, not measurement noise, but one that no single stream owns. A factor's *own*
variance is its main effect and its interactions short of the full one (with three streams:
its main effect and its two-way interactions),

    O_f = sum_{S containing f, S != full} s2_S;   re-draw variance V_f = O_f + s2_full,

V_f being how far the outcome moves when only f's seed is re-drawn. O_f = 0 has an exact test
(`own_test`): under it every mean square of a subset containing f has the expectation of the
full interaction's, so their pooled mean square over MS_full is F-distributed. The design
cannot say which stream the full interaction comes from, nor tell a stream apart from
another that always moves with it (aliased seeds are one factor).

Monte Carlo error. Interval ends are quantiles of draws; `montecarlo.quantile_ends` gives
each end's Monte Carlo standard error, so a reader and a verdict can see whether an end is
converged (re-exported here with `Ends`, `side_word` and `MC_SES`).

Unbalanced layouts (a failed run) have no exact mean squares: the mean then gets Owen's
pigeonhole bootstrap (Owen 2007, Ann. Appl. Stat. 1:246; each stream's levels resampled
independently, a conservative variance) with a t quantile on min(levels) - 1 df.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from fp4lab.analysis.frames import ok_runs
from fp4lab.analysis.montecarlo import MC_SES, Ends, quantile_ends, side_word
from fp4lab.schema import STREAMS

__all__ = [
    "MIN_LEVELS",
    "DRAWS",
    "MC_SES",
    "Ends",
    "side_word",
    "Layout",
    "layout",
    "mean_squares",
    "gci_draws",
    "gci_from_mean_squares",
    "quantile_ends",
    "own_subsets",
    "stream_draws",
    "own_test",
    "mean_interval",
    "pigeonhole_weights",
    "finite_runs",
    "paired_layout",
]

MIN_LEVELS = 3  # fewer levels of a stream: no interval
DRAWS = 200_000  # default generalized draws: 5,000 beyond each end of a 95 % interval
BOOTSTRAPS = 10_000  # at most this many pigeonhole resamples (each weighs every run)
BLOCK = 1 << 18  # resample weights are made and reduced this many at a time (2 MiB of float64)
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


def gci_draws(y: np.ndarray, lay: Layout, *, draws: int = DRAWS, seed: int = 0) -> dict:
    """Generalized pivotal draws of every component, the shares and the cell mean.

        R_S = MS_S df_S / U_S,  U_S ~ chi2(df_S);   s2_S* = max(0, EMS inversion of R);
        share_S* = clip(raw_S* / sum_T raw_T*, 0, 1)  (raw: the EMS inversion, untruncated);
        mu* = ybar - Z sqrt(sum_S s2_S* / prod_{f in S} n_f).

    Shares divide untruncated draws by their untruncated total (which is the total variance's
    own pivot): dividing truncated draws inflates the total by every term clipped at 0, and
    the interval of a dominant component's share then misses high (1 in 2 in a simulation
    with the full interaction at 84 %). A sum of components (a stream's own or re-draw
    variance) is the sum of the untruncated draws ("raw"), truncated at 0 once: truncating
    each term first would put the sum above 0 in nearly every draw, and its interval would
    never reach a true 0.

    Args:
      y: outcomes in layout order. lay: a balanced Layout. draws: Monte Carlo size.
      seed: seed of numpy's PCG64 (the same call gives the same draws).
    Returns:
      {"variance": {subset: (draws,)}, "raw": {subset: (draws,)} (untruncated),
       "share": {subset: (draws,)}, "mean": (draws,)}.
    """
    ms = mean_squares(y, lay)
    rng = np.random.default_rng(seed)
    return gci_from_mean_squares(ms, lay, float(np.mean(y)), draws=draws, rng=rng)


def gci_from_mean_squares(ms: dict, lay: Layout, mean, *, draws: int, rng) -> dict:
    """`gci_draws` from the mean squares: {subset: (MS_S, df_S)} and the cell mean.

    MS values and `mean` may be arrays of shape (B, 1) (B designs of one layout, as in the
    coverage simulations); the draws then have shape (B, draws), independent per design.
    """
    shape = np.broadcast_shapes(np.shape(mean), (draws,))
    pivots = {s: m * d / rng.chisquare(d, shape) for s, (m, d) in ms.items()}
    raw = ems_components(pivots, lay)
    variance = {s: np.maximum(v, 0.0) for s, v in raw.items()}
    total = sum(raw.values())
    share = {s: _share(v, total) for s, v in raw.items()}
    var_mean = sum(v / np.prod([lay.levels[i] for i in s]) for s, v in variance.items())
    mean = mean - rng.standard_normal(shape) * np.sqrt(var_mean)
    return {"variance": variance, "raw": raw, "share": share, "mean": mean}


def _share(part, total):
    """clip(part / total, 0, 1), total the sum of the untruncated components; NaN where the
    total is not positive."""
    positive = total > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(positive, np.clip(part / np.where(positive, total, 1.0), 0.0, 1.0), NAN)


def own_subsets(lay: Layout, index: int) -> list[tuple[int, ...]]:
    """The components a factor owns: every subset containing it but the full interaction,
    which all factors share (with one factor, the factor itself)."""
    full = tuple(range(len(lay.factors)))
    return [s for s in components(lay) if index in s and (s != full or len(full) == 1)]


def stream_draws(variances: dict, lay: Layout, index: int) -> dict:
    """A factor's own variance, its re-draw variance and its own share, from components.

        own = max(0, sum_{S in own(f)} s2_S),  redraw = max(0, own + s2_full),
        share = clip(sum_{S in own(f)} s2_S / sum_S s2_S, 0, 1)

    Args:
      variances: {subset: untruncated component} (values or draws: the "raw" of
        `gci_from_mean_squares`, or `ems_components` of the mean squares). lay: the Layout.
      index: the factor.
    Returns:
      {"own": ..., "redraw": ..., "share": ...}, of the values' shape.
    """
    own_set = own_subsets(lay, index)
    shared = [s for s in variances if index in s and s not in own_set]
    own = sum(variances[s] for s in own_set)
    redraw = np.maximum(own + sum(variances[s] for s in shared), 0.0)
    share = _share(own, sum(variances.values()))
    return {"own": np.maximum(own, 0.0), "redraw": redraw, "share": share}


class OwnTest(NamedTuple):
    """F-test of a factor's own variance: F, its degrees of freedom, and the p-value."""

    f: float
    df1: int
    df2: int
    p: float


def own_test(ms: dict, lay: Layout, index: int) -> OwnTest | None:
    """Exact test of O_f = 0, a factor's own variance (see the module docstring).

        F = [sum_{S in own(f)} SS_S / sum df_S] / MS_full  ~  F(sum df_S, df_full) under O_f = 0

    (each SS_S / E[MS_S] is an independent chi-square, and under O_f = 0 every E[MS_S] of a
    subset containing f equals E[MS_full]). A mean square of exactly 0 (runs that do not move
    at all) gives p = 1 for a zero numerator and p = 0 for a zero denominator: runs are
    deterministic, so an exact 0 is no sample.

    Args:
      ms: `mean_squares` of a balanced layout. lay: the Layout. index: the factor.
    Returns:
      OwnTest, or None with a single factor (there is no shared term to test against).
    """
    full = tuple(range(len(lay.factors)))
    if len(full) < 2:
        return None
    own = own_subsets(lay, index)
    ss = sum(ms[s][0] * ms[s][1] for s in own)
    df1 = sum(ms[s][1] for s in own)
    ms_full, df2 = ms[full]
    if ss == 0:
        return OwnTest(0.0, df1, df2, 1.0)
    if ms_full == 0:
        return OwnTest(float("inf"), df1, df2, 0.0)
    f = (ss / df1) / ms_full
    return OwnTest(float(f), df1, df2, float(scipy_stats.f.sf(f, df1, df2)))


def quantiles(draws: np.ndarray, level: float) -> tuple[float, float]:
    """The (1-level)/2 and (1+level)/2 quantiles of generalized pivotal draws."""
    ends = quantile_ends(draws, level)
    return float(ends.lo), float(ends.hi)


class MeanInterval(NamedTuple):
    """Mean over a crossed layout, its interval, and how the interval was made (or why not)."""

    estimate: float
    lo: float
    hi: float
    method: str
    lo_se: float = 0.0  # Monte Carlo standard error of each end (0: a closed-form interval)
    hi_se: float = 0.0


def mean_interval(
    y: np.ndarray, lay: Layout, *, level: float = 0.95, draws: int = DRAWS, seed: int = 0
) -> MeanInterval:
    """Interval of the mean of y over a crossed layout, seed levels as random effects.

    Balanced: the generalized interval of `gci_draws` (one factor: the t-interval). Unbalanced:
    pigeonhole bootstrap standard error (Owen 2007) times t(min levels - 1). Any factor with
    fewer than MIN_LEVELS levels (or no varying factor): no interval, method says why.

    Args:
      y: outcomes in layout order. lay: its Layout. level: coverage. draws: Monte Carlo size
        (generalized draws, or bootstrap resamples up to `BOOTSTRAPS`). seed: its seed.
    Returns:
      MeanInterval(mean, lo, hi, method, lo_se, hi_se): method "generalized", "t",
      "pigeonhole", or "too few seeds (...)"; lo_se, hi_se the Monte Carlo standard errors of
      the ends (0 for the t-interval; NaN without an interval).
    """
    y = np.asarray(y, np.float64)
    estimate = float(np.mean(y)) if y.size else NAN
    fewest = min(lay.levels, default=1)
    if fewest < MIN_LEVELS:
        why = f"too few seeds ({fewest} level(s); need 3)"
        return MeanInterval(estimate, NAN, NAN, why, NAN, NAN)
    if len(lay.factors) == 1 and lay.balanced:
        half = scipy_stats.t.ppf(0.5 + level / 2, y.size - 1) * y.std(ddof=1) / np.sqrt(y.size)
        return MeanInterval(estimate, estimate - half, estimate + half, "t")
    if lay.balanced:
        ends = quantile_ends(gci_draws(y, lay, draws=draws, seed=seed)["mean"], level)
        return MeanInterval(estimate, ends.lo, ends.hi, "generalized", ends.lo_se, ends.hi_se)
    rng = np.random.default_rng(seed)
    draws = min(draws, BOOTSTRAPS)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = [(w * y).sum(1) / w.sum(1) for w in pigeonhole_weights(rng, lay, draws)]
    boots = np.concatenate([np.empty(0), *means])
    half = scipy_stats.t.ppf(0.5 + level / 2, fewest - 1) * np.nanstd(boots, ddof=1)
    se = half / np.sqrt(2 * (np.sum(np.isfinite(boots)) - 1))  # of a standard deviation
    return MeanInterval(estimate, estimate - half, estimate + half, "pigeonhole", se, se)


def pigeonhole_weights(rng: np.random.Generator, lay: Layout, draws: int) -> Iterator[np.ndarray]:
    """Owen's pigeonhole resamples of a layout's runs, as weights in blocks of draws.

    Each factor's levels are drawn with replacement (multinomial counts, factor by factor, all
    `draws` at once, now), and draw i weighs run j by the product over factors of the count of
    j's level (1.0 times each, in factor order). The weights come as (block, runs) arrays, a
    block of draws at a time, each row as the whole (draws, runs) array would hold it: a
    caller that reduces each row on its own gets the numbers of the whole array without holding
    it (at 64,000 draws of 1,000 runs, 512 MB per temporary).
    """
    counts = [rng.multinomial(n, np.full(n, 1 / n), size=draws) for n in lay.levels]
    runs = len(lay.codes[0]) if lay.codes else 0
    return _weight_blocks(counts, lay.codes, draws, runs)


def _weight_blocks(counts, codes, draws: int, runs: int) -> Iterator[np.ndarray]:
    step = max(1, BLOCK // max(runs, 1))
    for start in range(0, draws, step):
        weight = np.ones((min(step, draws - start), runs))
        for count, code in zip(counts, codes, strict=True):
            weight *= count[start : start + step][:, code]
        yield weight


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
