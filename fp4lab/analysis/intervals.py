"""Intervals for independent draws: exact (Clopper-Pearson) and Wilson for proportions, t for
means, Welch t for ratios of geometric means, BCa bootstraps.

Every estimate in `fp4lab.analysis` comes with an interval, and the interval says how it was
made; bootstraps are seeded (`seed=`): the same call gives the same interval, and their ends
carry their Monte Carlo standard errors (`MCInterval`; batches are added until the word is
decided, `montecarlo.batched_ends`). Fewer than 3 values give no interval. Runs of crossed
seed streams are not independent draws: their intervals come from `fp4lab.analysis.crossed`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from statistics import NormalDist
from typing import Any, NamedTuple

import numpy as np
from scipy import stats as scipy_stats

from fp4lab.analysis.montecarlo import BATCHES, batched_ends

__all__ = [
    "Interval",
    "MCInterval",
    "Stat",
    "wilson_interval",
    "exact_binomial_interval",
    "t_interval",
    "percentile_interval",
    "bootstrap_ci",
    "median_interval",
    "ratio_ci",
    "log_ratio_interval",
    "fieller_interval",
]

Stat = Callable[..., Any]  # a numpy reduction, called as stat(array, axis=-1)
NAN = float("nan")


class Interval(NamedTuple):
    """A point estimate and the two ends of its interval."""

    estimate: float
    lo: float
    hi: float


class MCInterval(NamedTuple):
    """An interval from resamples: estimate, ends and each end's Monte Carlo standard error."""

    estimate: float
    lo: float
    hi: float
    lo_se: float = 0.0
    hi_se: float = 0.0


def wilson_interval(k, n, level: float = 0.95) -> Interval:
    """Wilson score interval for a proportion k/n (Wilson 1927).

        p = k/n,  z = Phi^-1((1 + level)/2)
        centre = (p + z^2/(2n)) / (1 + z^2/n)
        half   = z / (1 + z^2/n) * sqrt(p(1 - p)/n + z^2/(4n^2))

    Unlike the normal approximation it stays inside [0, 1] and is not degenerate at k = 0 or
    k = n (0 of 5 diverged gives [0, 0.43], not [0, 0]). The same as scipy's
    `binomtest(k, n).proportion_ci(method="wilson")` (a test checks it), vectorised.

    Args:
      k: successes (scalar or array). n: trials (same shape; n = 0 gives NaN).
      level: coverage of the interval.
    Returns:
      Interval(p, lo, hi), floats for scalar input, arrays otherwise.
    """
    k, n = np.asarray(k, np.float64), np.asarray(n, np.float64)
    z = NormalDist().inv_cdf(0.5 + level / 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = k / n
        denom = 1 + z**2 / n
        centre = (p + z**2 / (2 * n)) / denom
        half = z / denom * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    lo, hi = np.clip(centre - half, 0, 1), np.clip(centre + half, 0, 1)
    if p.ndim == 0:
        return Interval(float(p), float(lo), float(hi))
    return Interval(p, lo, hi)


def exact_binomial_interval(k, n, level: float = 0.95) -> Interval:
    """Clopper-Pearson interval for a proportion k/n (Clopper & Pearson 1934).

        lo = Beta^-1((1 - level)/2; k, n - k + 1)    (0 at k = 0)
        hi = Beta^-1((1 + level)/2; k + 1, n - k)    (1 at k = n)

    Its coverage is at least `level` at every true rate, whatever n: the interval the tables
    print for rates (divergence, runs with a spike). Wilson's (`wilson_interval`) is narrower
    but under-covers at the studies' 6-8 runs: at 8 runs it misses 7.7 % and 14.9 % of the
    time at true rates of 1 % and 2 % (its lower end at k = 1 is already 2.2 %), 7.0 % at
    1/2 (tests/analysis/test_coverage_designs.py). The same as scipy's
    `binomtest(k, n).proportion_ci(method="exact")`, vectorised. Arguments and return as
    `wilson_interval`'s.
    """
    k, n = np.asarray(k, np.float64), np.asarray(n, np.float64)
    alpha = 1 - level
    with np.errstate(invalid="ignore", divide="ignore"):
        p = k / n
        lo = np.where(k > 0, scipy_stats.beta.ppf(alpha / 2, k, n - k + 1), 0.0)
        hi = np.where(k < n, scipy_stats.beta.ppf(1 - alpha / 2, k + 1, n - k), 1.0)
    lo, hi = np.where(n > 0, lo, NAN), np.where(n > 0, hi, NAN)
    if p.ndim == 0:
        return Interval(float(p), float(lo), float(hi))
    return Interval(p, lo, hi)


def percentile_interval(boots: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The (1-level)/2 and (1+level)/2 quantiles of bootstrap replicates.

    Replicates may be +-inf (a statistic over runs that never reached a target); quantiles are
    taken without interpolation so that inf stays inf. NaN replicates are undefined (e.g. inf/inf):
    when more than (1-level)/2 of them are NaN, either end could lie among them and the interval
    is (NaN, NaN).
    """
    boots = np.asarray(boots, np.float64).ravel()
    alpha = (1 - level) / 2
    defined = boots[~np.isnan(boots)]
    if defined.size == 0 or defined.size < (1 - alpha) * boots.size:
        return NAN, NAN
    lo, hi = np.quantile(defined, [alpha, 1 - alpha], method="inverted_cdf")
    return float(lo), float(hi)


def t_interval(values, level: float = 0.95, *, min_n: int = 3) -> Interval:
    """Student t interval of the mean of independent values (Student 1908).

        mean +- t_{n-1, (1+level)/2} * s / sqrt(n),   s the sample SD (ddof 1)

    Exact for normal data and close for most others at n >= 3; unlike a percentile bootstrap
    it is not too narrow at small n (at n = 4-8 a percentile interval is 20-50 % narrower).
    For runs of crossed seed streams use `fp4lab.analysis.crossed.mean_interval`: the runs are
    not independent.

    Args:
      values: 1-D data, independent draws (e.g. one per seed triple (i, i, i)).
      level: coverage. min_n: below this many values the interval is (NaN, NaN).
    Returns:
      Interval(mean, lo, hi).
    """
    x = np.asarray(values, np.float64).ravel()
    if x.size == 0:
        return Interval(NAN, NAN, NAN)
    mean = float(x.mean())
    if x.size < max(min_n, 2):
        return Interval(mean, NAN, NAN)
    half = scipy_stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size)
    return Interval(mean, float(mean - half), float(mean + half))


def median_interval(values, level: float = 0.95) -> Interval:
    """Distribution-free interval of the median from order statistics (Thompson 1936).

        [x_(k), x_(n+1-k)],   k the largest with P(Binomial(n, 1/2) < k) <= (1 - level) / 2

    Its coverage is at least `level` for any continuous distribution (exactly 1 - 2 P(B < k)),
    whatever n; +inf values (a target never reached) are order statistics like any other, so
    an end is inf where that many runs never reached. The price is width at small n: with 6-8
    values it is [min, max] (coverage 96.9-99.2 %). A percentile or BCa bootstrap of the median
    at n = 8 missed 7-8 % at a nominal 5 % (tests/analysis/test_tokens_coverage.py). No k
    exists below n = 6 at 95 %: then the interval is (NaN, NaN).
    """
    x = np.sort(np.asarray(values, np.float64).ravel())
    if x.size == 0:
        return Interval(NAN, NAN, NAN)
    estimate = float(np.median(x))
    below = scipy_stats.binom.cdf(np.arange(x.size) - 1, x.size, 0.5)  # P(B < k), k = 0..n-1
    k = int(np.sum(below <= (1 - level) / 2)) - 1  # the largest such k (k = 0 never counts)
    if k < 1:
        return Interval(estimate, NAN, NAN)
    return Interval(estimate, float(x[k - 1]), float(x[x.size - k]))


def bootstrap_ci(
    values,
    stat: Stat = np.mean,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
    min_n: int = 3,
    batches: tuple[int, int] = BATCHES,
) -> MCInterval:
    """Bootstrap interval of stat(values): BCa (Efron 1987; Efron & Tibshirani 1993, ch. 14).

    `scipy.stats.bootstrap(method="BCa")` with `n_boot` resamples per batch from numpy's PCG64
    seeded with (`seed`, batch); the ends are the mean over batches, with their Monte Carlo
    standard errors, and batches are added until the deciding end of the interval is
    `montecarlo.MC_SES` standard errors from 0 or the cap (`montecarlo.batched_ends`). BCa
    corrects the percentile interval for bias and skew, which at small n makes it wider and
    closer to nominal. Values that are +-inf (a run that never reached a target) defeat BCa's
    jackknife; the interval is then the plain percentile interval (`percentile_interval`),
    read as optimistic. Assumes the values are independent (one per seed triple (i, i, i));
    crossed seed streams are not, see `fp4lab.analysis.crossed`. Where BCa is undefined (a
    degenerate jackknife, e.g. the median of tied values) the interval is the percentile one.

    Args:
      values: 1-D data; +-inf allowed, NaN is the caller's to remove.
      stat: a reduction called as stat(array, axis=-1), e.g. np.mean, np.median.
      n_boot: resamples per batch. level: coverage. seed: the resampling seed.
      min_n: below this many values (default 3) the interval is (NaN, NaN).
      batches: (first, cap) numbers of batches.
    Returns:
      MCInterval(stat(values), lo, hi, lo_se, hi_se).
    """
    x = np.asarray(values, np.float64).ravel()
    if x.size == 0:
        return MCInterval(NAN, NAN, NAN)
    estimate = float(stat(x, axis=-1))
    if x.size < max(min_n, 2):
        return MCInterval(estimate, NAN, NAN)
    if np.all(x == x[0]):
        return MCInterval(estimate, estimate, estimate)

    def batch(k: int) -> tuple[float, float]:
        rng = np.random.default_rng([seed, k])
        if np.all(np.isfinite(x)):
            ends = _bca((x,), stat, n_boot, level, rng)
            if ends is not None:
                return ends
        # +-inf among the values, or BCa's jackknife is degenerate (a median of tied values)
        idx = rng.integers(0, x.size, size=(n_boot, x.size))
        return percentile_interval(stat(x[idx], axis=-1), level)

    return MCInterval(estimate, *batched_ends(batch, batches))


def _bca(samples: tuple, statistic: Stat, n_boot: int, level: float, rng) -> tuple | None:
    """The ends of the BCa interval of `statistic` over `samples` (each resampled on its own,
    `scipy.stats.bootstrap`), or None where BCa is undefined: a degenerate jackknife (tied
    values, a constant sample) gives NaN ends."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a degenerate jackknife warns and gives NaN
        res = scipy_stats.bootstrap(
            samples,
            statistic,
            n_resamples=n_boot,
            confidence_level=level,
            method="BCa",
            vectorized=True,
            random_state=rng,
        )
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return (lo, hi) if np.isfinite(lo) and np.isfinite(hi) else None


def ratio_ci(
    num,
    den,
    stat: Stat = np.median,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
    batches: tuple[int, int] = BATCHES,
) -> MCInterval:
    """Bootstrap interval of stat(num) / stat(den) - 1, the two samples resampled independently.

    Independent (unpaired) resampling ignores any pairing of seeds between the two samples,
    which makes the interval conservative when runs that share seeds are correlated. A ratio
    inf/inf (neither sample reaches) is undefined (NaN); finite/inf is -1. With finite values
    the interval is BCa (`scipy.stats.bootstrap` on the two samples, batched and converged as
    in `bootstrap_ci`); infinite values (runs that never reached a target) defeat BCa's
    jackknife, and so does a sample of equal values, and the interval is then the plain
    percentile interval, read as optimistic at small n. Fewer than 3 values in either sample:
    no interval. Not for tokens to target: on a bimodal crossing (a run meets the target at an
    early dip or tens of steps later) the BCa interval of a ratio of medians of 8 and 8 runs
    missed 10-17 % at a nominal 5 % (tests/analysis/test_tokens_coverage.py); use
    `log_ratio_interval`.
    """
    a, b = np.asarray(num, np.float64).ravel(), np.asarray(den, np.float64).ravel()
    if a.size == 0 or b.size == 0:
        return MCInterval(NAN, NAN, NAN)

    def ratio(x, y, axis=-1):
        return stat(x, axis=axis) / stat(y, axis=axis) - 1

    with np.errstate(invalid="ignore", divide="ignore"):
        estimate = float(ratio(a, b))
    if min(a.size, b.size) < 3:
        return MCInterval(estimate, NAN, NAN)

    def batch(k: int) -> tuple[float, float]:
        rng = np.random.default_rng([seed, k])
        with np.errstate(invalid="ignore", divide="ignore"):
            if np.all(np.isfinite(a)) and np.all(np.isfinite(b)):
                ends = _bca((a, b), ratio, n_boot, level, rng)
                if ends is not None:
                    return ends
            ia = rng.integers(0, a.size, size=(n_boot, a.size))
            ib = rng.integers(0, b.size, size=(n_boot, b.size))
            return percentile_interval(ratio(a[ia], b[ib]), level)

    return MCInterval(estimate, *batched_ends(batch, batches))


def log_ratio_interval(num, den, level: float = 0.95) -> Interval:
    """Ratio of geometric means minus 1, with Welch's t-interval on the logs (Welch 1947).

        d = mean(log num) - mean(log den),   v = s_num^2 / n_num + s_den^2 / n_den
        df = v^2 / (s_num^4 / (n_num^2 (n_num - 1)) + s_den^4 / (n_den^2 (n_den - 1)))
        overhead = exp(d) - 1,   interval exp(d -+ t_{df, (1+level)/2} sqrt(v)) - 1

    The overhead of tokens to target: the two groups' runs are independent (no pairing
    assumed), and the logs make the interval a ratio. Unlike a bootstrap it has no Monte
    Carlo error, and unlike a ratio of medians it stays near its level where the crossing is
    bimodal (a run meets the target at an early dip or tens of steps later): 4.3-5.5 %
    misses at a nominal 5 % with 8 and 8 runs (tests/analysis/test_tokens_coverage.py).
    Runs that never reach (+inf): every value of `num` inf and none of `den` gives
    (inf, inf, inf), the reverse (-1, -1, -1); otherwise any inf gives no interval (the
    geometric mean of a sample with some never-reached runs is inf, and its interval
    undefined) and an estimate of inf, -1 or NaN. Fewer than 3 values in either sample, or no
    spread in both: no interval (a spread-free pair of samples gives its ratio exactly).

    Args:
      num, den: positive values of the two groups (tokens), +inf allowed. level: coverage.
    Returns:
      Interval(overhead, lo, hi).
    """
    a, b = np.asarray(num, np.float64).ravel(), np.asarray(den, np.float64).ravel()
    if a.size == 0 or b.size == 0:
        return Interval(NAN, NAN, NAN)
    if np.any(a <= 0) or np.any(b <= 0) or np.isnan(a).any() or np.isnan(b).any():
        raise ValueError("log_ratio_interval: the values must be positive (tokens), no NaN")
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    if inf_a.any() or inf_b.any():  # a geometric mean with a never-reached run in it is inf
        if inf_a.any() and inf_b.any():
            return Interval(NAN, NAN, NAN)
        estimate = np.inf if inf_a.any() else -1.0
        certain = (inf_a.all() or inf_b.all()) and min(a.size, b.size) >= 3
        return Interval(estimate, *((estimate, estimate) if certain else (NAN, NAN)))
    la, lb = np.log(a), np.log(b)
    d = float(la.mean() - lb.mean())
    if min(a.size, b.size) < 3:
        return Interval(float(np.expm1(d)), NAN, NAN)
    va, vb = la.var(ddof=1) / a.size, lb.var(ddof=1) / b.size
    if va + vb == 0:
        return Interval(float(np.expm1(d)), float(np.expm1(d)), float(np.expm1(d)))
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    half = scipy_stats.t.ppf(0.5 + level / 2, df) * np.sqrt(va + vb)
    return Interval(float(np.expm1(d)), float(np.expm1(d - half)), float(np.expm1(d + half)))


def fieller_interval(num, den, level: float = 0.95) -> tuple[float, float]:
    """Fieller's interval (Fieller 1954) of mean(num) / mean(den) from paired values.

    The set of ratios r with (mean(num) - r mean(den))^2 <= t^2 Var(mean(num) - r mean(den)),
    t the Student quantile on n - 1 degrees of freedom and the variance from the pairs' sample
    covariance: exact when the pairs are bivariate normal, whatever their correlation. With
    few pairs a percentile bootstrap of the ratio is far too narrow (about 20 % misses at a
    nominal 95 % with 4 pairs; tests/analysis/test_fieller.py). Where mean(den) is not clearly
    away from 0 the set is unbounded: (-inf, inf) is returned. NaN below 3 pairs.
    """
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    n = num.size
    if n != den.size:
        raise ValueError(f"fieller_interval: {n} numerators, {den.size} denominators")
    if n < 3:
        return NAN, NAN
    mn, md = num.mean(), den.mean()
    cov = np.cov(np.vstack([num, den]), ddof=1) / n
    t2 = scipy_stats.t.ppf((1 + level) / 2, n - 1) ** 2
    a = md * md - t2 * cov[1, 1]
    b = -2 * (mn * md - t2 * cov[0, 1])
    c = mn * mn - t2 * cov[0, 0]
    disc = b * b - 4 * a * c
    if a <= 0 or disc < 0:  # the denominator's mean is within its own interval of 0
        return -np.inf, np.inf
    root = np.sqrt(disc)
    return float((-b - root) / (2 * a)), float((-b + root) / (2 * a))
