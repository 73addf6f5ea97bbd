"""Monte Carlo error of interval ends computed from draws, and the words read off them.

Generalized intervals (`crossed`) are quantiles of random draws, and bootstrap intervals
(`intervals.bootstrap_ci`, `ratio_ci`) are computed from resamples, so their ends move with the
Monte Carlo seed. Each end gets a standard error; a word ("higher", "lower", "no evidence")
is given only when its deciding end is `MC_SES` standard errors clear of 0, so that the words
do not depend on the Monte Carlo seed. Where an interval is remade batch by batch
(`batched_ends`), batches are added until its word is decided or a cap is reached.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = ["MC_SES", "BATCHES", "Ends", "batched_ends", "more_draws", "quantile_ends", "side_word"]

MC_SES = 3  # a word needs its deciding end this many Monte Carlo standard errors from 0
NAN = float("nan")
BATCHES = (4, 64)  # `batched_ends`: the first and the most independent batches


class Ends(NamedTuple):
    """An interval's ends from draws and the Monte Carlo standard error of each end."""

    lo: float | np.ndarray
    hi: float | np.ndarray
    lo_se: float | np.ndarray
    hi_se: float | np.ndarray


def quantile_ends(draws: np.ndarray, level: float) -> Ends:
    """The (1-level)/2 and (1+level)/2 quantiles of draws (NaN draws left out; all NaN: NaN)
    and their Monte Carlo standard errors.

    The ends interpolate linearly between order statistics (numpy's default quantile). The
    standard error of the p-quantile of n draws: the number of draws below it is
    binomial(n, p), so the order statistics at ranks p(n-1) -+ sqrt(n p (1-p)) bracket it by
    about one standard error each way, and se = (x_(upper) - x_(lower)) / 2 (Maritz & Jarrett
    1978 without the Beta weights; distribution-free, no density estimate needed).

    Args:
      draws: (..., n) draws; leading axes are independent sets. level: central coverage.
    Returns:
      Ends(lo, hi, lo_se, hi_se): floats for 1-D draws, else arrays of the leading shape.
    """
    x = np.asarray(draws, np.float64)
    if x.shape[-1] == 0:
        x = np.full((*x.shape[:-1], 1), NAN)
    n = np.sum(~np.isnan(x), axis=-1, keepdims=True)
    last = np.maximum(n - 1, 0)
    alpha = (1 - level) / 2
    ends = []
    for p in (alpha, 1 - alpha):
        rank, spread = p * last, np.sqrt(n * p * (1 - p))
        below = np.clip(np.floor(rank - spread), 0, last).astype(np.int64)
        above = np.clip(np.floor(rank + spread) + 1, 0, last).astype(np.int64)
        ends.append((rank, below, above))
    # NaN sort last. A full sort, not a partition at the ranks read: the same order statistics,
    # and numpy's vectorized sort is faster than its partition at several ranks
    x = np.sort(x, axis=-1)

    def at(index):
        return np.take_along_axis(x, index, axis=-1)

    out = []
    for rank, below, above in ends:
        floor = np.floor(rank).astype(np.int64)
        frac = rank - floor
        value = at(floor) + frac * (at(np.minimum(floor + 1, last)) - at(floor))
        value = np.where(frac > 0, value, at(floor))
        se = (at(above) - at(below)) / 2
        out += [np.where(n == 0, NAN, value)[..., 0], np.where(n == 0, NAN, se)[..., 0]]
    lo, lo_se, hi, hi_se = out
    if np.ndim(lo) == 0:
        return Ends(float(lo), float(hi), float(lo_se), float(hi_se))
    return Ends(lo, hi, lo_se, hi_se)


def side_word(lo: float, hi: float, lo_se: float = 0.0, hi_se: float = 0.0) -> str:
    """The word of an interval of a difference: "higher" / "lower" when it excludes 0, "no
    evidence" when it contains 0, each only when the deciding end is more than `MC_SES`
    Monte Carlo standard errors (`quantile_ends`) from 0; else "undecided" (more draws decide)."""
    if lo > MC_SES * lo_se:
        return "higher"
    if hi < -MC_SES * hi_se:
        return "lower"
    if lo < -MC_SES * lo_se and hi > MC_SES * hi_se:
        return "no evidence"
    return "undecided"


def batched_ends(batch: Callable[[int], tuple[float, float]], batches=BATCHES) -> Ends:
    """An interval's ends as the mean over independent Monte Carlo batches, with the standard
    error of that mean; batches are added (doubling) until `side_word` decides or a cap.

        lo = mean_k lo_k,  lo_se = sd_k(lo_k) / sqrt(K)      (the same for hi)

    Each batch is a whole interval remade from its own seed (e.g. a BCa bootstrap of its own
    resamples), so the standard error covers every part of it that moves with the seed (BCa's
    bias correction as well as its quantiles). An end that is the same in every batch (a
    degenerate or infinite end) has standard error 0. A word still "undecided" at the cap
    stays "undecided" in the tables.

    Args:
      batch: batch(k) -> (lo, hi), the interval from batch k's own seed (k = 0, 1, ...).
      batches: (first, cap) numbers of batches.
    Returns:
      Ends(lo, hi, lo_se, hi_se).
    """
    first, cap = batches
    ends = [batch(k) for k in range(first)]
    while True:
        e = np.asarray(ends, np.float64)  # (K, 2)
        with np.errstate(invalid="ignore"):
            mean = e.mean(0)
            same = np.all(e == e[0], axis=0) | np.all(np.isnan(e), axis=0)
            spread = e.std(0, ddof=1) / np.sqrt(len(e)) if len(e) > 1 else np.full(2, NAN)
            se = np.where(same, 0.0, spread)  # one batch: the error is unknown (NaN)
        lo, hi, lo_se, hi_se = (float(v) for v in (*mean, *se))
        settled = np.isnan(lo) or np.isnan(hi) or (lo_se == 0 and hi_se == 0)  # more won't move
        if settled or len(ends) >= cap or side_word(lo, hi, lo_se, hi_se) != "undecided":
            return Ends(lo, hi, lo_se, hi_se)
        ends += [batch(k) for k in range(len(ends), min(2 * len(ends), cap))]


def more_draws(make: Callable[[int], tuple], draws: int, cap: int):
    """`make(draws)` again with 4 times the draws while its word is "undecided" and the draws
    stay within `cap`: an interval whose deciding end is within `MC_SES` Monte Carlo standard
    errors of 0 is redrawn until it is decided or the cap says more draws cost too much.

    Args:
      make: make(draws) -> an interval with fields lo, hi, lo_se, hi_se.
      draws: the first number of draws. cap: the most draws.
    Returns:
      The last interval made.
    """
    interval = make(draws)
    while draws * 4 <= cap and np.isfinite([interval.lo, interval.hi]).all():
        if side_word(interval.lo, interval.hi, interval.lo_se, interval.hi_se) != "undecided":
            break
        if interval.lo_se == 0 and interval.hi_se == 0:  # a closed form: draws change nothing
            break
        draws *= 4
        interval = make(draws)
    return interval
