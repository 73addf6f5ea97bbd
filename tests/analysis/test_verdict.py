"""The verdict: planted effects found, null streams not, too few seeds refused, one family."""

import math

import numpy as np
import pandas as pd
import pytest
from crossed_design import crossed_cell  # tests/analysis/crossed_design.py

from fp4lab import analysis


def cell(name, levels=(5, 5, 5), offset=0.0, sd=None, rng=0, interaction=None):
    """A crossed cell with small stream SDs by default (init, data, init:data and residual)."""
    sd = sd or (0.01, 0.01, 0.0, 0.005, 0.0, 0.0, 0.005)
    return crossed_cell(name, levels, sd, rng, offset, interaction)


def test_verdict_has_the_columns_and_counts_the_family():
    runs = pd.concat([cell("a"), cell("b", offset=0.05, rng=1)])
    v = analysis.verdict(runs, "loss_gap")
    for column in ("factor", "kind", "term", "verdict", "effect", "lo", "hi", "share", "levels"):
        assert column in v.columns
    assert v.attrs["correction"] == "Bonferroni"
    # one contrast and two judged streams per cell (quant has no effect but 5 levels: judged)
    assert v.attrs["comparisons"] == 1 + 2 * 3
    assert v.attrs["row_level"] == pytest.approx(1 - 0.05 / 7)
    fixed = v[v.kind == "fixed"].iloc[0]
    assert fixed["term"] == "b - a" and fixed["verdict"] == "higher"
    assert fixed["lo"] < 0.05 < fixed["hi"]
    assert fixed["in_seed_sd"] > 1  # the precision effect dwarfs the seed spread
    assert v.equals(analysis.verdict(runs, "loss_gap"))  # seeded: same call, same table


def test_quant_effect_that_lives_only_in_an_interaction_is_found():
    runs = cell("nvfp4", interaction=0.01, rng=2)
    v = analysis.verdict(runs).set_index("factor")
    assert v.loc["quant", "verdict"] == "matters" and v.loc["quant", "lo"] > 0
    comps = analysis.variance_components(runs).set_index("component")
    assert comps.loc["init:quant", "lo"] > 0  # the interaction carries it ...
    assert comps.loc["quant", "share"] < 0.05  # ... not the quant main effect


def test_null_stream_gets_no_evidence_with_an_interval_containing_zero():
    # runs are deterministic functions of their seeds: a stream without effect changes nothing
    runs = cell("bf16", sd=(0.01, 0.01, 0.0, 0.005, 0.0, 0.0, 0.0), rng=3)
    v = analysis.verdict(runs).set_index("factor")
    quant = v.loc["quant"]
    assert quant["verdict"] == "no evidence" and quant["lo"] <= 0 <= quant["hi"]
    assert "no effect at all" in quant["evidence"]
    assert v.loc["init", "verdict"] == v.loc["data", "verdict"] == "matters"


def test_null_cell_effect_is_no_evidence_and_says_what_could_be_missed():
    runs = pd.concat([cell("a", rng=4), cell("b", rng=5)])
    row = analysis.verdict(runs).query("kind == 'fixed'").iloc[0]
    assert row["verdict"] == "no evidence" and row["lo"] < 0 < row["hi"]
    assert f"{max(-row['lo'], row['hi']):.3g} could be missed" in row["evidence"]


def test_fewer_than_three_levels_is_too_few_seeds_never_a_share():
    runs = pd.concat([cell("a", levels=(2, 5, 5)), cell("b", levels=(2, 5, 5), rng=1)])
    v = analysis.verdict(runs)
    rows = v[v.kind == "random"]
    assert set(rows["verdict"]) == {"too few seeds"} and rows["share"].isna().all()
    fixed = v[v.kind == "fixed"].iloc[0]
    assert fixed["verdict"] == "too few seeds" and math.isnan(fixed["lo"])
    assert v.attrs["comparisons"] == 0


def test_one_quant_seed_is_not_varied_and_cells_pair_on_what_they_share():
    bf16 = cell("bf16", rng=6)
    bf16 = bf16[bf16.seed_quant == 0]
    nvfp4 = cell("nvfp4", offset=0.04, rng=6)  # the same seed effects, plus quant noise
    nvfp4["loss_gap"] += 0.003 * np.random.default_rng(7).normal(size=len(nvfp4))
    runs = pd.concat([bf16, nvfp4])
    v = analysis.verdict(runs)
    quant = v[(v.factor == "quant") & (v.term == "bf16")].iloc[0]
    assert quant["verdict"] == "not varied" and quant["levels"] == 1
    fixed = v[v.kind == "fixed"].iloc[0]
    assert "25 pairs over 5x5 seeds" in fixed["evidence"]  # nvfp4 averaged over its quant seeds
    assert fixed["verdict"] == "higher"


def test_paired_difference_pairs_on_shared_streams():
    runs = pd.concat([cell("base", rng=8), cell("worse", offset=0.01, rng=8)])
    table = analysis.paired_difference(runs, "base").set_index("cell")
    assert list(table.columns) == ["pairs", "diff", "diff_lo", "diff_hi", "diff_mcse", "verdict"]
    worse = table.loc["worse"]  # the same seed effects in both cells: they cancel exactly
    assert worse["pairs"] == 125 and worse["diff"] == pytest.approx(0.01)
    assert worse["verdict"] == "higher" and worse["diff_hi"] - worse["diff_lo"] < 1e-9


def test_a_cell_of_one_run_and_a_contrast_of_one_pair_are_too_few_seeds():
    runs = pd.concat([cell("a", levels=(1, 1, 1)), cell("b", levels=(3, 3, 3), rng=1)])
    v = analysis.verdict(runs)
    assert v.loc[v.kind == "fixed", "verdict"].tolist() == ["too few seeds"]  # one pair
    assert v.loc[v.kind == "fixed", "evidence"].iloc[0].startswith("one shared seed (init/data")
    assert set(v.loc[v.term == "a", "verdict"]) == {"not varied"}
    assert v.attrs["comparisons"] == 3  # the three streams of cell b


def test_fixed_rows_name_the_design_choice_the_cells_differ_in():
    base = dict(recipe="nvfp4", gemms="[]", rules="[]", backward="", phases="[]")
    runs = pd.concat(
        [
            cell("bf16", rng=8).assign(**base | dict(recipe="bf16")),
            cell("nvfp4", offset=0.04, rng=9).assign(**base),
            cell("nvfp4,wgrad=bf16", offset=0.03, rng=10).assign(**base | dict(gemms="wgrad")),
        ]
    )
    draws = 20_000  # not the default 1,000,000: the factor names do not depend on the draws
    fixed = analysis.verdict(runs, draws=draws).query("kind == 'fixed'").set_index("term")["factor"]
    assert fixed["nvfp4 - bf16"] == "recipe"
    assert fixed["nvfp4,wgrad=bf16 - nvfp4"] == "GEMM overrides"
    assert fixed["nvfp4,wgrad=bf16 - bf16"] == "recipe + GEMM overrides"
    # without design columns the factor is the grouping column
    plain = pd.concat([cell("a"), cell("b", rng=1)])
    fixed = analysis.verdict(plain, draws=draws).query("kind == 'fixed'")["factor"]
    assert fixed.tolist() == ["cell"]
