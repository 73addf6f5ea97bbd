"""Bootstrap intervals carry their Monte Carlo error and are remade until their word is
decided (`montecarlo.batched_ends`, used by `bootstrap_ci` and `ratio_ci`)."""

import numpy as np
from scipy import stats as scipy_stats

from fp4lab.analysis import bootstrap_ci, ratio_ci
from fp4lab.analysis.montecarlo import BATCHES, MC_SES, Ends, batched_ends, more_draws, side_word


def _counting(ends_of):
    calls = []

    def batch(k):
        calls.append(k)
        return ends_of(k)

    return batch, calls


def test_batches_are_added_until_the_word_is_decided_or_the_cap():
    first, cap = BATCHES
    clear, calls = _counting(lambda k: (0.5 + 0.01 * (-1) ** k, 1.0))  # batch noise 0.01
    ends = batched_ends(clear)
    assert len(calls) == first and side_word(*ends) == "higher"
    # a lower end at 0.002 with batch noise 0.01: never 3 standard errors clear by the cap
    edge, calls = _counting(lambda k: (0.002 + 0.01 * (-1) ** k, 1.0))
    ends = batched_ends(edge)
    assert len(calls) == cap and side_word(*ends) == "undecided"
    assert ends.lo_se > 0 and ends.hi_se == 0  # an end the same in every batch has no error
    # where more batches decide it, they are added (4 -> 8 -> 16) and no more
    near, calls = _counting(lambda k: (0.01 + 0.01 * (-1) ** k, 1.0))
    ends = batched_ends(near)
    assert len(calls) == 16 and ends.lo > MC_SES * ends.lo_se


def test_the_ends_are_scipy_s_bca_within_their_monte_carlo_error():
    """The mean over batches against scipy's BCa from 100 000 resamples (whose own Monte Carlo
    error is a tenth of ours at 4 batches of 2000)."""
    x = np.random.default_rng(3).gamma(2.0, 1.0, 12)
    ours = bootstrap_ci(x, np.mean, seed=1)
    ref = scipy_stats.bootstrap(
        (x,), np.mean, n_resamples=100_000, method="BCa", random_state=np.random.default_rng(9)
    ).confidence_interval
    assert abs(ours.lo - ref.low) < 4 * ours.lo_se + 1e-3
    assert abs(ours.hi - ref.high) < 4 * ours.hi_se + 1e-3
    assert 0 < ours.lo_se < 0.05 * (ours.hi - ours.lo)


def test_no_two_seeds_give_opposite_words():
    """A ratio whose lower end sits near 0: over 12 bootstrap seeds the word is one decided
    word or "undecided", never "higher" for one seed and "no evidence" for another."""
    gen = np.random.default_rng(0)
    a, b = np.exp(gen.normal(0.09, 0.1, 8)), np.exp(gen.normal(0.0, 0.1, 8))
    words = set()
    for seed in range(12):
        i = ratio_ci(a, b, np.median, n_boot=500, seed=seed)
        words.add(side_word(i.lo, i.hi, i.lo_se, i.hi_se))
    assert len(words - {"undecided"}) <= 1, words


def test_generalized_draws_are_redrawn_four_times_more_until_decided():
    """`more_draws` (paired_difference's contrasts): an end 0.01 from 0 whose Monte Carlo
    error shrinks as 1/sqrt(draws) is undecided at 1000 and 4000 draws, decided at 16 000."""
    made = []

    def make(n):
        made.append(n)
        se = 0.01 * np.sqrt(1000 / n)
        return Ends(0.01, 1.0, se, se)

    interval = more_draws(make, 1000, 16_000)
    assert made == [1000, 4000, 16_000] and side_word(*interval) == "higher"
    made.clear()
    assert side_word(*more_draws(make, 1000, 8000)) == "undecided" and made == [1000, 4000]
