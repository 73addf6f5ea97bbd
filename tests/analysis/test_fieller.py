"""Fieller's interval of a ratio of paired means: coverage by simulation, and its edge cases.

The share of a gap that a choice closes (`fp4lab.diagnosis.verify.gap_table`) is
mean(gain) / mean(gap) over paired seeds. 1000 tables per design, each drawn with a known
share; a design passes when the misses are at most the upper end of the binomial 99.9 % band
of 1 - level (as tests/analysis/test_coverage.py). The percentile bootstrap it replaced is
checked to fail the same criterion, so the test can tell the two apart.
"""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fp4lab.analysis.intervals import fieller_interval

SIMS = 1000
LEVEL = 0.95
UPPER = scipy_stats.binom(SIMS, 1 - LEVEL).ppf(0.9995)

DESIGNS = {  # pairs, true share, gain noise SD, gap SD (gap mean 1), gain-gap correlation
    "4 seeds, two thirds closed": (4, 0.67, 0.3, 0.3),
    "4 seeds, noisy gain, little closed": (4, 0.2, 0.5, 0.3),
    "8 seeds": (8, 0.67, 0.3, 0.3),
    "4 seeds, precise": (4, 0.67, 0.05, 0.05),
}


def _tables(pairs, share, sd_gain, sd_gap, seed):
    rng = np.random.default_rng(seed)
    gap = 1 + sd_gap * rng.normal(size=(SIMS, pairs))
    gain = share * gap + sd_gain * rng.normal(size=(SIMS, pairs))  # shares the gap's noise
    return gain, gap


@pytest.mark.parametrize("name", DESIGNS)
def test_fieller_covers_the_share(name):
    pairs, share, sd_gain, sd_gap = DESIGNS[name]
    gain, gap = _tables(pairs, share, sd_gain, sd_gap, seed=len(name))
    ends = np.array([fieller_interval(g, d, LEVEL) for g, d in zip(gain, gap, strict=True)])
    misses = int(np.sum((ends[:, 0] > share) | (ends[:, 1] < share)))
    assert misses <= UPPER, f"{name}: {misses}/{SIMS} misses, band up to {UPPER:.0f}"
    # unbounded only where a table's gap mean is within its own interval of 0: rare here
    assert np.isfinite(ends).all(axis=1).mean() > 0.9


def test_the_percentile_bootstrap_it_replaced_undercovers():
    pairs, share, sd_gain, sd_gap = DESIGNS["4 seeds, two thirds closed"]
    gain, gap = _tables(pairs, share, sd_gain, sd_gap, seed=1)
    rng = np.random.default_rng(2)
    misses = 0
    for g, d in zip(gain, gap, strict=True):
        idx = rng.integers(0, pairs, size=(2000, pairs))
        lo, hi = np.quantile(g[idx].mean(1) / d[idx].mean(1), [0.025, 0.975])
        misses += not lo <= share <= hi
    assert misses > UPPER  # about 200 of 1000: why gap_table uses Fieller's interval


def test_known_values_and_edges():
    # no spread in the ratio: the interval is that ratio
    d = np.array([1.0, 2.0, 3.0, 4.0])
    lo, hi = fieller_interval(0.5 * d, d)
    assert lo == pytest.approx(0.5) and hi == pytest.approx(0.5)
    # a denominator whose mean is within its own interval of 0: unbounded
    assert fieller_interval([1.0, 2.0, 3.0], [-1.0, 0.5, 0.7]) == (-np.inf, np.inf)
    assert all(np.isnan(fieller_interval([1.0, 2.0], [1.0, 1.0])))  # fewer than 3 pairs
    with pytest.raises(ValueError, match="3 numerators, 2 denominators"):
        fieller_interval([1.0, 2.0, 3.0], [1.0, 2.0])
    # uncorrelated, equal-variance check against the closed form at r = mean ratio's ends
    rng = np.random.default_rng(5)
    num, den = 1 + 0.2 * rng.normal(size=6), 2 + 0.2 * rng.normal(size=6)
    lo, hi = fieller_interval(num, den)
    t2 = scipy_stats.t.ppf(0.975, 5) ** 2
    cov = np.cov(num, den) / 6
    for r in (lo, hi):  # each end solves (mn - r md)^2 = t^2 Var(mn - r md)
        left = (num.mean() - r * den.mean()) ** 2
        right = t2 * (cov[0, 0] - 2 * r * cov[0, 1] + r * r * cov[1, 1])
        assert left == pytest.approx(right, rel=1e-9)
