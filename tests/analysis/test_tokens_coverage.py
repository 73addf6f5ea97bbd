"""Coverage of the tokens-to-target intervals (`analysis.tokens_to_target`), by simulation.

Tokens to target per seed are drawn log-normal (a spread like the ladders': coefficient of
variation 5-20 %), rounded up to whole steps (ties, as real runs have), and with a share of
runs that never reach (+inf). The median's interval (`median_interval`, order statistics) must
miss at most as often as its level allows at 6, 8 and 12 seeds; the overhead's (`ratio_ci`,
two samples of 8 resampled independently, BCa) likewise where every run reaches. A test passes
when the misses are at most the upper end of the binomial 99.9 % band of the nominal miss rate.

What failed here and is no longer printed: a BCa or percentile bootstrap of the median of 8
runs (what tokens_to_target printed before) missed 7.2-8.0 % at a nominal 5 % in 2000 draws
(band up to 6.6 %). Not covered: the overhead's interval where some runs never reach (then a
plain percentile interval, said to be optimistic in `ratio_ci`).
"""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fp4lab.analysis import bootstrap_ci, median_interval, ratio_ci

LEVEL = 0.95


def band_upper(sims: int, rate: float) -> int:
    return int(scipy_stats.binom(sims, rate).ppf(0.9995))


def draw(rng, n, median_steps, cv, never=0.0):
    steps = np.ceil(median_steps * np.exp(rng.normal(0.0, cv, n)))
    return np.where(rng.random(n) < never, np.inf, steps)


def true_median(median_steps, cv, never):
    """The population median of draw(): the finite part's quantile 0.5 / (1 - never)."""
    q = 0.5 / (1 - never)
    return np.ceil(median_steps * np.exp(cv * scipy_stats.norm.ppf(q)))


@pytest.mark.parametrize("n", [6, 8, 12])
@pytest.mark.parametrize("cv,never", [(0.05, 0.0), (0.2, 0.0), (0.1, 0.25)])
def test_the_median_interval_covers(n, cv, never):
    sims, rng = 2000, np.random.default_rng(n * 1000 + int(cv * 100) + int(never * 10))
    truth = true_median(250, cv, never)
    misses = 0
    for _ in range(sims):
        i = median_interval(draw(rng, n, 250, cv, never), LEVEL)
        assert np.isfinite(i.lo)
        misses += not (i.lo <= truth <= i.hi)
    assert misses <= band_upper(sims, 1 - LEVEL), f"{misses} misses in {sims}"


def test_below_six_values_there_is_no_median_interval():
    i = median_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert i.estimate == 3.0 and np.isnan(i.lo) and np.isnan(i.hi)
    assert median_interval([3.0, 1.0, np.inf, 2.0, 5.0, 4.0]) == (3.5, 1.0, np.inf)


@pytest.mark.parametrize("cv", [0.05, 0.2])
def test_the_overhead_interval_covers_where_every_run_reaches(cv):
    sims, rng = 1000, np.random.default_rng(int(cv * 100))
    truth = 250 / 200 - 1  # the population medians (rounding up to whole steps keeps them)
    misses = 0
    for s in range(sims):
        i = ratio_ci(draw(rng, 8, 250, cv), draw(rng, 8, 200, cv), n_boot=1000, seed=s)
        misses += not (i.lo <= truth <= i.hi)
    assert misses <= band_upper(sims, 1 - LEVEL), f"{misses} misses in {sims}"


def test_the_bootstrap_of_a_median_of_8_undercovers():
    """Why the median's interval is not a bootstrap: at 8 seeds it misses too often."""
    sims, rng = 2000, np.random.default_rng(7)
    misses = 0
    for s in range(sims):
        i = bootstrap_ci(draw(rng, 8, 250, 0.1), np.median, n_boot=1000, seed=s)
        misses += not (i.lo <= 250 <= i.hi)
    assert misses > band_upper(sims, 1 - LEVEL)
