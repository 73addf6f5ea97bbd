"""Intervals: Wilson for proportions, seeded bootstraps for statistics over seeds.

Every estimate in `fp4lab.analysis` comes with an interval, and the interval says how it was
made; bootstraps are seeded (`seed=`): the same call gives the same interval.
"""

from __future__ import annotations

from collections.abc import Callable
from statistics import NormalDist
from typing import Any, NamedTuple

import numpy as np

__all__ = ["Interval", "Stat", "wilson_interval", "percentile_interval", "bootstrap_ci", "ratio_ci"]

Stat = Callable[..., Any]  # a numpy reduction, called as stat(array, axis=-1)
NAN = float("nan")


class Interval(NamedTuple):
    """A point estimate and the two ends of its interval."""

    estimate: float
    lo: float
    hi: float


def wilson_interval(k, n, level: float = 0.95) -> Interval:
    """Wilson score interval for a proportion k/n (Wilson 1927).

        p = k/n,  z = Phi^-1((1 + level)/2)
        centre = (p + z^2/(2n)) / (1 + z^2/n)
        half   = z / (1 + z^2/n) * sqrt(p(1 - p)/n + z^2/(4n^2))

    Unlike the normal approximation it stays inside [0, 1] and is not degenerate at k = 0 or
    k = n (0 of 5 diverged gives [0, 0.43], not [0, 0]).

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


def bootstrap_ci(
    values,
    stat: Stat = np.mean,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
    min_n: int = 2,
) -> Interval:
    """Percentile bootstrap interval of stat(values) (Efron & Tibshirani 1993, ch. 13).

    Draws `n_boot` resamples of the n values with replacement (numpy's PCG64 seeded with
    `seed`, so the same call gives the same interval), computes the statistic on each and
    takes the (1-level)/2 and (1+level)/2 quantiles. Assumes the values are exchangeable
    (e.g. one per seed of a cell); with few seeds the percentile interval is too narrow
    rather than too wide, so read it as optimistic.

    Args:
      values: 1-D data; +-inf allowed (see `percentile_interval`), NaN is the caller's to remove.
      stat: a reduction called as stat(array, axis=-1), e.g. np.mean, np.median.
      n_boot: number of resamples. level: coverage. seed: the resampling seed.
      min_n: below this many values the interval is (NaN, NaN): one seed has no spread.
    Returns:
      Interval(stat(values), lo, hi).
    """
    x = np.asarray(values, np.float64).ravel()
    if x.size == 0:
        return Interval(NAN, NAN, NAN)
    estimate = float(stat(x, axis=-1))
    if x.size < min_n:
        return Interval(estimate, NAN, NAN)
    idx = np.random.default_rng(seed).integers(0, x.size, size=(n_boot, x.size))
    return Interval(estimate, *percentile_interval(stat(x[idx], axis=-1), level))


def ratio_ci(
    num,
    den,
    stat: Stat = np.median,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Bootstrap interval of stat(num) / stat(den) - 1, the two samples resampled independently.

    Independent (unpaired) resampling ignores any pairing of seeds between the two samples,
    which makes the interval conservative when runs that share seeds are correlated. A ratio
    inf/inf (neither sample reaches) is undefined (NaN); finite/inf is -1.
    """
    a, b = np.asarray(num, np.float64).ravel(), np.asarray(den, np.float64).ravel()
    if a.size == 0 or b.size == 0:
        return Interval(NAN, NAN, NAN)
    with np.errstate(invalid="ignore", divide="ignore"):
        estimate = float(stat(a) / stat(b) - 1)
        if min(a.size, b.size) < 2:
            return Interval(estimate, NAN, NAN)
        rng = np.random.default_rng(seed)
        ia = rng.integers(0, a.size, size=(n_boot, a.size))
        ib = rng.integers(0, b.size, size=(n_boot, b.size))
        boots = stat(a[ia], axis=-1) / stat(b[ib], axis=-1) - 1
    return Interval(estimate, *percentile_interval(boots, level))
