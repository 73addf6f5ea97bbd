"""Does one per-run quantity predict another? A correlation over crossed seeds, within cells.

A sweep's runs share seeds across cells (seed i of the init stream is the same draw in every
cell) and, inside a cell, across runs (crossed init x data x quant seeds). So its runs are not
independent pairs (x, y), and a textbook interval for a correlation over them is too narrow.

    within_correlation(runs, x, y)

takes each run's x and y, subtracts each cell's mean from both (what is left is what the seeds
did: the cell's own effect is gone, so a cell that is worse on both counts cannot make the
correlation by itself) and correlates the residuals pooled over cells. The interval resamples
the seeds, not the runs: Owen's pigeonhole bootstrap (Owen 2007, Ann. Appl. Stat. 1:246) draws
the levels of each stream independently with replacement (streams whose seeds always move
together, as in seed triples (i, i, i), count as one), the same draw in every cell, and
weighs each run by the product of its levels' counts; the standard error of Fisher's z of the
weighted correlation over those draws, times a t quantile on min(levels) - 1 degrees of
freedom, gives the interval on the z scale (as `crossed.mean_interval` does for an unbalanced
mean). The pigeonhole variance is conservative for crossed designs (Owen 2007); with 5 levels
per stream the t quantile keeps the interval from being too narrow. Each end carries its Monte
Carlo standard error (that of the bootstrap SD, sd / sqrt(2 (draws - 1)), carried through tanh);
where an end is within `MC_SES` of them from 0 the draws are doubled, up to `MAX_BOOTSTRAPS`.
Coverage is checked by simulation in tests/analysis/test_association.py.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from fp4lab.analysis.crossed import MIN_LEVELS, layout, pigeonhole_weights
from fp4lab.analysis.frames import ok_runs
from fp4lab.analysis.montecarlo import side_word
from fp4lab.schema import STREAMS

__all__ = ["Correlation", "within_correlation"]

BOOTSTRAPS = 4000
MAX_BOOTSTRAPS = 64_000  # draws are doubled up to this while the word is undecided
NAN = float("nan")


class Correlation(NamedTuple):
    """A within-cell correlation, its interval and how the interval was made (or why not)."""

    r: float
    lo: float
    hi: float
    n: int  # runs used
    method: str
    lo_mcse: float = 0.0  # Monte Carlo standard error of each end
    hi_mcse: float = 0.0


def _weighted_r(w: np.ndarray, x: np.ndarray, y: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """Correlation of x and y after subtracting each cell's weighted mean; w: (draws, runs)."""
    xr, yr = np.zeros_like(w), np.zeros_like(w)
    for c in np.unique(cells):
        m = cells == c
        wc = w[:, m]
        tot = wc.sum(1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            xr[:, m] = x[m] - (wc * x[m]).sum(1, keepdims=True) / tot
            yr[:, m] = y[m] - (wc * y[m]).sum(1, keepdims=True) / tot
    xr, yr = np.nan_to_num(xr) * (w > 0), np.nan_to_num(yr) * (w > 0)
    sxy, sxx, syy = (w * xr * yr).sum(1), (w * xr * xr).sum(1), (w * yr * yr).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sxy / np.sqrt(sxx * syy)


def within_correlation(
    runs: pd.DataFrame,
    x: str,
    y: str,
    *,
    streams: tuple[str, ...] = STREAMS,
    level: float = 0.95,
    draws: int = BOOTSTRAPS,
    seed: int = 0,
) -> Correlation:
    """The correlation of columns x and y over runs, within cells, seeds resampled (module doc).

    Args:
      runs: a runs table (cell, seed_<stream> columns; rows with status "ok" and finite x, y
        are used). x, y: the columns. streams: the seed streams. level: the interval's
        coverage. draws: pigeonhole resamples (the first batch). seed: their seed.
    Returns:
      Correlation(r, lo, hi, n, method, lo_mcse, hi_mcse): method "pigeonhole z" or why there
      is no interval (a stream that varies with fewer than 3 levels, or no varying stream).
    """
    rows = ok_runs(runs)
    vals = rows[[x, y]].astype(np.float64).to_numpy()
    rows = rows[np.isfinite(vals).all(1)]
    xs, ys = rows[x].to_numpy(np.float64), rows[y].to_numpy(np.float64)
    cells = pd.factorize(rows["cell"])[0]
    r = float(_weighted_r(np.ones((1, len(rows))), xs, ys, cells)[0]) if len(rows) else NAN
    lay = layout(rows, streams)  # streams that always move together are one factor
    if not lay.factors:
        return Correlation(r, NAN, NAN, len(rows), "no varying seed stream")
    levels = lay.levels
    if min(levels) < MIN_LEVELS:
        return Correlation(r, NAN, NAN, len(rows), f"too few seeds ({min(levels)} level(s))")
    z = np.arctanh(np.clip(r, -1 + 1e-12, 1 - 1e-12))
    t = scipy_stats.t.ppf(0.5 + level / 2, min(levels) - 1)
    rng = np.random.default_rng(seed)
    boots = np.empty(0)
    while True:
        blocks = pigeonhole_weights(rng, lay, draws - boots.size)  # one row per draw
        r_drawn = np.concatenate([np.empty(0), *(_weighted_r(w, xs, ys, cells) for w in blocks)])
        drawn = np.arctanh(np.clip(r_drawn, -1 + 1e-12, 1 - 1e-12))
        boots = np.concatenate([boots, drawn])
        sd = np.nanstd(boots, ddof=1)
        lo, hi = float(np.tanh(z - t * sd)), float(np.tanh(z + t * sd))
        se_z = t * sd / np.sqrt(2 * (np.sum(np.isfinite(boots)) - 1))  # of a standard deviation
        lo_se, hi_se = float((1 - lo**2) * se_z), float((1 - hi**2) * se_z)
        decided = side_word(lo, hi, lo_se, hi_se) != "undecided" or not np.isfinite(lo + hi)
        if decided or draws >= MAX_BOOTSTRAPS:
            return Correlation(r, lo, hi, len(rows), "pigeonhole z", lo_se, hi_se)
        draws = min(2 * draws, MAX_BOOTSTRAPS)
