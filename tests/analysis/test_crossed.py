"""Crossed seed streams: mean squares by hand, REML against the ANOVA estimator, coverage."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from crossed_design import COMPONENTS, crossed_cell  # tests/analysis/crossed_design.py

from fp4lab import analysis
from fp4lab.analysis import components, crossed

# component order of a three-stream layout: init, data, quant, init:data, init:quant,
# data:quant, residual (the init:data:quant interaction)
NAMES = list(COMPONENTS)


def crossed_runs(levels=(4, 4, 4), sd=(1, 0.7, 0.5, 0.5, 0.8, 0.3, 0.4), rng=0, cell="c"):
    return crossed_cell(cell, levels, sd, rng)


def test_layout_drops_constant_streams_and_merges_aliased_ones():
    runs = pd.DataFrame(dict(seed_init=[0, 1, 2, 3], seed_data=[0, 1, 2, 3], seed_quant=0))
    lay = crossed.layout(runs)
    assert lay.factors == ("init=data",) and lay.levels == (4,) and lay.balanced
    assert not crossed.layout(crossed_runs().iloc[:-1]).balanced  # one run missing


def test_mean_squares_and_components_match_the_hand_formulas():
    runs = crossed_runs(levels=(3, 4, 5))
    y, lay = runs["loss_gap"].to_numpy(), crossed.layout(runs)
    table = y.reshape(3, 4, 5)
    ms = {crossed.component_name(lay, s): m for s, (m, _) in crossed.mean_squares(y, lay).items()}
    # main effect of init: 20 runs per level, 2 df
    ss_a = 20 * ((table.mean((1, 2)) - y.mean()) ** 2).sum()
    assert ms["init"] == pytest.approx(ss_a / 2)
    # direct: the residual of the full two-way model is the three-way interaction
    three_way = (
        table
        - table.mean(2, keepdims=True)
        - table.mean(1, keepdims=True)
        - table.mean(0, keepdims=True)
        + table.mean((1, 2), keepdims=True)
        + table.mean((0, 2), keepdims=True)
        + table.mean((0, 1), keepdims=True)
        - y.mean()
    )
    assert ms["residual"] == pytest.approx((three_way**2).sum() / (2 * 3 * 4))
    # s2_init = (MS_A - MS_AB - MS_AC + MS_E) / (b c)
    comps = analysis.variance_components(runs, method="anova").set_index("component")
    raw = (ms["init"] - ms["init:data"] - ms["init:quant"] + ms["residual"]) / 20
    assert comps.loc["init", "variance"] == pytest.approx(max(raw, 0.0))
    assert comps.loc["init:data", "variance"] == pytest.approx(
        max((ms["init:data"] - ms["residual"]) / 5, 0.0)
    )


def test_reml_agrees_with_the_expected_mean_squares_on_a_balanced_design():
    """REML (statsmodels MixedLM, variance components) equals the ANOVA estimator of a balanced
    crossed design when every ANOVA estimate is positive."""
    for rng in (0, 5, 14):
        runs = crossed_runs(levels=(5, 5, 4), sd=(1, 0.8, 0.6, 0.5, 0.6, 0.5, 0.4), rng=rng)
        anova = analysis.variance_components(runs, method="anova").set_index("component")
        assert (anova["variance"] > 0).all() and anova["note"].drop("residual").eq("").all()
        assert anova.loc["residual", "note"] == components.RESIDUAL_SHARE
        reml = analysis.variance_components(runs, method="reml").set_index("component")
        # equal up to the optimizer's tolerance
        np.testing.assert_allclose(reml["variance"], anova["variance"], rtol=2e-3)
        assert reml["lo"].equals(anova["lo"])  # the intervals do not depend on the estimator


def test_variance_components_columns_levels_and_determinism():
    runs = pd.concat([crossed_runs(cell="a"), crossed_runs(levels=(4, 4, 2), rng=1, cell="b")])
    runs.loc[runs.cell == "b", "seed_quant"] = 0  # cell b: one quant seed
    runs = runs[~((runs.cell == "b") & runs.duplicated(["cell", "seed_init", "seed_data"]))]
    table = analysis.variance_components(runs, "loss_gap", ("init", "data", "quant"), by="cell")
    for column in ("cell", "component", "variance", "share", "lo", "hi", "levels"):
        assert column in table.columns
    a = table[table.cell == "a"].set_index("component")
    assert list(a.index) == NAMES and a["share"].sum() == pytest.approx(1.0)
    assert (a["lo"] <= a["variance"]).all() and (a["variance"] <= a["hi"]).all()
    b = table[table.cell == "b"].set_index("component")
    assert b.loc["quant", "note"] == "not varied (1 level)" and math.isnan(b.loc["quant", "share"])
    assert list(b.index) == ["quant", "init", "data", "residual"]  # residual = init:data
    assert table.equals(analysis.variance_components(runs))  # seeded: same call, same table
    other = analysis.variance_components(runs, seed=1)
    assert not other["lo"].equals(table["lo"])


def test_fewer_than_three_levels_give_no_interval():
    runs = crossed_runs(levels=(2, 4, 4))
    table = analysis.variance_components(runs).set_index("component")
    assert math.isnan(table.loc["init", "lo"]) and "too few seeds" in table.loc["init", "note"]
    assert np.isfinite(table.loc["data", "lo"])
    interval = crossed.mean_interval(runs["loss_gap"].to_numpy(), crossed.layout(runs))
    assert math.isnan(interval.lo) and interval.method.startswith("too few seeds")


def test_one_stream_gives_the_t_interval_and_missing_runs_the_pigeonhole():
    y = np.random.default_rng(0).normal(size=6)
    runs = pd.DataFrame(dict(seed_init=range(6), seed_data=range(6), seed_quant=range(6)))
    interval = crossed.mean_interval(y, crossed.layout(runs))
    t = analysis.t_interval(y)
    assert interval.method == "t" and (interval.lo, interval.hi) == pytest.approx((t.lo, t.hi))
    runs = crossed_runs().iloc[:-3]
    lay = crossed.layout(runs)
    interval = crossed.mean_interval(runs["loss_gap"].to_numpy(), lay)
    assert interval.method == "pigeonhole" and interval.lo < interval.estimate < interval.hi


@pytest.mark.parametrize("stat", ["share", "mean"])
def test_intervals_cover_the_truth_in_synthetic_crossed_designs(stat):
    """Nominal 95 % intervals of every share and of the cell mean (true mean 0) cover the truth
    in at least 90 % of 200 designs with 3-8 levels per stream and known components."""
    sd = np.array([1.0, 0.7, 0.5, 0.5, 0.8, 0.3, 0.4])
    share = sd**2 / (sd**2).sum()
    gen = np.random.default_rng(7)
    hits, draws = np.zeros(len(sd)), 200
    for r in range(draws):
        levels = tuple(int(n) for n in gen.integers(3, 9, size=3))
        runs = crossed_runs(levels=levels, sd=sd, rng=1000 + r)
        y, lay = runs["loss_gap"].to_numpy(), crossed.layout(runs)
        if stat == "mean":
            interval = crossed.mean_interval(y, lay, draws=2000, seed=r)
            hits[0] += interval.lo <= 0.0 <= interval.hi
            continue
        shares = crossed.gci_draws(y, lay, draws=2000, seed=r)["share"]
        for n, subset in enumerate(crossed.components(lay)):
            lo, hi = crossed.quantiles(shares[subset], 0.95)
            hits[n] += lo <= share[n] <= hi
    coverage = hits[:1] / draws if stat == "mean" else hits / draws
    assert coverage.min() >= 0.90, dict(zip(NAMES, coverage, strict=False))


def test_components_are_exactly_zero_for_a_stream_without_effect():
    runs = crossed_runs(levels=(3, 3, 3), sd=(1, 0.7, 0, 0.5, 0, 0, 0))
    table = analysis.variance_components(runs).set_index("component")
    for name in ("quant", "init:quant", "data:quant", "residual"):
        assert table.loc[name, "variance"] == 0 and table.loc[name, "hi"] == 0
        note = components.RESIDUAL_SHARE if name == "residual" else ""
        assert table.loc[name, "note"] == note
    assert list(itertools.islice(table.index, 3)) == ["init", "data", "quant"]
