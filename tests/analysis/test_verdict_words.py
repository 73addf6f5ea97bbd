"""The verdict's words: a stream's row tests its own variance, never the shared term; words do
not depend on the Monte Carlo seed on the committed results."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from crossed_design import crossed_cell, crossed_outcomes  # tests/analysis/crossed_design.py

from fp4lab import analysis
from fp4lab.analysis import crossed
from fp4lab.analysis.columns import MissingColumn

RESULTS = Path(__file__).resolve().parents[2] / "results"
# component SDs: init, data, quant, init:data, init:quant, data:quant, residual
SHARED_ONLY = (0.01, 0.0, 0.0, 0.0, 0.0, 0.0, 0.004)  # data and quant own nothing


@pytest.mark.parametrize("rng", range(4))
def test_a_stream_that_owns_nothing_under_shared_noise_does_not_matter(rng):
    """6x6x6 seeds, run-to-run noise of SD 0.004 that no stream owns (the three-way term):
    data and quant do nothing of their own and must not read "matters"; init still does.
    (Before: every varied stream read "matters", its SD being mostly the shared term.)"""
    runs = crossed_cell("c", (6, 6, 6), SHARED_ONLY, rng)
    v = analysis.verdict(runs).set_index("factor")
    assert v.loc["init", "verdict"] == "matters"
    for stream in ("data", "quant"):
        row = v.loc[stream]
        assert row["verdict"] != "matters", row["evidence"]
        assert row["redraw_sd"] > 0.003  # it still moves the outcome, through the shared term
    assert v.loc["init", "p"] < 1e-6


def test_an_own_effect_through_an_interaction_under_a_large_shared_term_matters():
    sd = (0.01, 0.0, 0.0, 0.0, 0.004, 0.0, 0.006)  # quant acts only with init, under shared
    v = analysis.verdict(crossed_cell("c", (6, 6, 6), sd, 11)).set_index("factor")
    assert v.loc["quant", "verdict"] == "matters" and v.loc["quant", "lo"] > 0
    assert v.loc["data", "verdict"] != "matters"


def test_the_own_f_test_matches_its_formula():
    runs = crossed_cell("c", (4, 5, 3), (0.3, 0.2, 0.1, 0.2, 0.1, 0.2, 0.5), 3)
    y, lay = runs["loss_gap"].to_numpy(), crossed.layout(runs)
    ms = crossed.mean_squares(y, lay)
    test = crossed.own_test(ms, lay, 2)  # quant: quant, init:quant, data:quant over residual
    own = [(2,), (0, 2), (1, 2)]
    num = sum(ms[s][0] * ms[s][1] for s in own) / sum(ms[s][1] for s in own)
    assert (test.df1, test.df2) == (2 + 3 * 2 + 4 * 2, 3 * 4 * 2)
    assert test.f == pytest.approx(num / ms[(0, 1, 2)][0])


def test_the_own_f_test_holds_its_level_under_the_null():
    """Quant owns nothing; 2000 tables: rejections at 5 % within the binomial 99.9 % band."""
    rejections, sims = 0, 2000
    levels, sd = (4, 3, 5), (1.0, 0.5, 0.0, 0.3, 0.0, 0.0, 1.5)
    lay = crossed.layout(crossed_cell("c", levels, sd, 0))  # every table's layout
    for r in range(sims):
        y = crossed_outcomes(levels, sd, 10_000 + r)[0]  # crossed_cell's loss_gap, no table
        rejections += crossed.own_test(crossed.mean_squares(y, lay), lay, 2).p < 0.05
    assert 70 <= rejections <= 133  # scipy.stats.binom(2000, 0.05).ppf([0.0005, 0.9995])


def test_an_end_within_its_monte_carlo_error_of_zero_is_undecided():
    assert crossed.side_word(0.001, 0.01, 0.0002, 0.0002) == "higher"
    assert crossed.side_word(0.0005, 0.01, 0.0002, 0.0002) == "undecided"
    assert crossed.side_word(-0.0005, 0.01, 0.0002, 0.0002) == "undecided"
    assert crossed.side_word(-0.001, 0.01, 0.0002, 0.0002) == "no evidence"
    assert crossed.side_word(-0.01, -0.001, 0.0002, 0.0002) == "lower"


def test_quantile_ends_and_their_monte_carlo_error():
    """Ends equal numpy's quantiles; the standard error matches the spread of the end over
    independent sets of draws (within 25 %)."""
    x = np.random.default_rng(0).normal(size=(400, 4000))
    ends = crossed.quantile_ends(x, 0.99)
    np.testing.assert_allclose(ends.lo, np.quantile(x, 0.005, axis=-1))
    np.testing.assert_allclose(ends.hi, np.quantile(x, 0.995, axis=-1))
    assert np.median(ends.lo_se) == pytest.approx(np.std(ends.lo), rel=0.25)
    assert np.median(ends.hi_se) == pytest.approx(np.std(ends.hi), rel=0.25)


@pytest.mark.parametrize("name", ["randomness_vs_error", "randomness_vs_error_fresh"])
def test_committed_verdict_words_do_not_depend_on_the_monte_carlo_seed(name):
    """The committed outcomes (every run's seeds, design columns and loss gap), judged with two
    Monte Carlo seeds: the same words; with seed 0, the committed verdict.csv to the byte, whose
    ends carry their Monte Carlo errors."""
    outcomes = pd.read_csv(RESULTS / name / "outcomes.csv")
    committed = pd.read_csv(RESULTS / name / "verdict.csv")
    assert {"lo_mcse", "hi_mcse", "redraw_mcse", "share_mcse", "p"} <= set(committed.columns)
    tables = [analysis.verdict(outcomes, "loss_gap", seed=s) for s in (0, 7)]
    assert tables[0]["verdict"].tolist() == tables[1]["verdict"].tolist()
    # and the committed table is the one its outcomes give, as `fp4lab run` writes it
    text = analysis.with_family(tables[0]).to_csv(index=False, float_format="%.5g")
    assert text == (RESULTS / name / "verdict.csv").read_text()


@pytest.mark.parametrize("column", ["seed_quant", "loss_gap", "cell", "status"])
def test_a_missing_column_is_one_line_naming_it(column):
    runs = crossed_cell("c", (3, 3, 3), SHARED_ONLY, 0).drop(columns=[column])
    for function in (analysis.verdict, analysis.variance_components):
        with pytest.raises(MissingColumn, match=f"{function.__name__}: .* {column!r}") as err:
            function(runs, "loss_gap")
        assert "\n" not in str(err.value)


def test_in_words_names_each_cell_against_the_baseline_recipe():
    """bf16 is the baseline whatever the cells' order; a planted +0.05 reads "higher than"."""
    sd = (0.01, 0.01, 0.0, 0.005, 0.0, 0.0, 0.005)
    runs = pd.concat(
        [
            crossed_cell("recipe=nvfp4", (5, 5, 5), sd, 1, 0.05).assign(recipe="nvfp4"),
            crossed_cell("recipe=bf16", (5, 5, 5), sd, 0).assign(recipe="bf16"),
            crossed_cell("recipe=mxfp8", (5, 5, 5), sd, 2).assign(recipe="mxfp8"),
        ]
    )
    header, lines = analysis.verdicts.in_words(runs, "loss_gap")
    assert header.startswith("against recipe=bf16 (loss_gap;")
    assert lines[0].startswith("recipe=nvfp4: higher than recipe=bf16 by +0.05")
    assert lines[1].startswith("recipe=mxfp8: no evidence of a difference")
    assert analysis.verdicts.in_words(runs[runs.cell == "recipe=bf16"]) == ("", [])
