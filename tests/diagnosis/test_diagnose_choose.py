"""Sets within a FLOP budget, and rules that quantize_model and Config take as they are."""

import jax
import numpy as np
import pandas as pd
import pytest
from flax import nnx

import fp4lab as fl
from fp4lab.analysis.intervals import fieller_interval
from fp4lab.diagnosis import choose, gate, scores

# three layers by depth; c costs half of all FLOPs
TABLE = pd.DataFrame(
    [(layer, gemm, depth, flops) for layer, depth, flops in (("a", 0, 1), ("b", 1, 1), ("c", 2, 2))
     for gemm in ("fprop", "dgrad", "wgrad")],
    columns=["layer", "gemm", "depth", "flops"],
)  # fmt: skip


def test_share_counts_gemm_flops():
    assert choose.share(TABLE, [("c", "wgrad")]) == pytest.approx(2 / 12)
    assert choose.share(TABLE, [(layer, "fprop") for layer in "abc"]) == pytest.approx(4 / 12)


def test_top_takes_the_ranking_within_the_budget_skipping_what_does_not_fit():
    ranked = TABLE.assign(s=[0, 0, 5, 0, 0, 0, 9, 0, 1])  # c fprop 9, a wgrad 5, c wgrad 1
    ranked = scores.rank(ranked.assign(**{"own_error": ranked["s"]}), "own_error")
    assert choose.top(ranked, 3 / 12) == [("c", "fprop"), ("a", "wgrad")]
    # the budget is a ceiling: nothing fits 1 % (the cheapest GEMM costs 1/12), said in words
    assert choose.top(ranked, 0.01) == []
    assert choose.over_budget(ranked, 0.01) == (
        "no GEMM fits the budget of 1.00% of GEMM FLOPs: the cheapest costs 8.33%; raise the "
        "budget to at least that"
    )
    assert choose.over_budget(ranked, 1 / 12) == ""
    # one tolerance: a share that sums to the budget up to rounding fits it
    thirds = pd.DataFrame({"layer": list("abc"), "gemm": ["fprop"] * 3, "depth": [0, 1, 2],
                           "flops": [0.1, 0.2, 0.7]})  # fmt: skip
    assert len(choose.top(thirds, (0.1 + 0.2) / 1.0)) == 2  # 0.30000000000000004 > 0.3
    assert choose.share(thirds, choose.at_random(thirds, 0.3 + 1e-12, seed=0)) <= 0.3 + 1e-9


def _scored(means, los, fp4=None):
    """TABLE with alone_step_loss means, lower ends (upper ends above), and the all-FP4 total."""
    t = TABLE.assign(alone_step_loss=means, alone_step_loss_lo=los)
    t = t.assign(alone_step_loss_hi=t["alone_step_loss"] * 2 + 1)
    return scores.rank(t if fp4 is None else t.assign(fp4_step_loss=fp4), "alone_step_loss")


def test_a_gemm_is_kept_only_where_its_gain_is_resolved_and_worth_its_flops():
    # c fprop: 0.6 of a total of 1.0, lower end 0.4 >= its 2/12 of the FLOPs: kept
    # a wgrad: lower end 0.05 < its 1/12 (a decoy's few percent): not worth its FLOPs
    # b dgrad: a large mean whose interval reaches zero: unresolved
    means = [0, 0, 0.08, 0, 0.3, 0, 0.6, 0, 0]
    los = [-0.1, -0.1, 0.05, -0.1, -0.01, -0.1, 0.4, -0.1, -0.1]
    ranked = _scored(means, los, fp4=1.0)
    rule = choose.worth(ranked, "alone_step_loss").set_index(ranked["layer"] + " " + ranked["gemm"])
    assert rule.loc["c fprop", "gain_lo"] == pytest.approx(0.4) and rule.loc["c fprop", "worth"]
    assert rule.loc["a wgrad", "why"] == "not worth its FLOPs"
    assert rule.loc["b dgrad", "why"] == "unresolved"
    chosen = choose.top(ranked, 1.0, "alone_step_loss")  # a ceiling, not a quota
    assert chosen == [("c", "fprop")]
    left = choose.left_out(ranked, chosen, "alone_step_loss")
    assert left[["layer", "gemm", "why"]].values.tolist() == [["a", "wgrad", "not worth its FLOPs"]]
    # within a budget that c fprop does not fit, it is named as left out by the budget
    assert choose.top(ranked, 0.1, "alone_step_loss") == []
    left = choose.left_out(ranked, [], "alone_step_loss")
    assert left[["layer", "gemm", "why"]].values.tolist()[0] == ["c", "fprop", "budget"]
    # the predicted share is of the all-FP4 model's own score, not of the summed scores
    assert choose.predicted_share(ranked, chosen, "alone_step_loss") == pytest.approx(0.6)
    assert choose.predicted_share(_scored(means, los), chosen, "alone_step_loss") == (
        pytest.approx(0.6 / 0.98)
    )


def test_last_takes_whole_layers_from_the_deepest_and_random_is_seeded():
    assert choose.last(TABLE, 0.5) == [("c", g) for g in ("fprop", "dgrad", "wgrad")]
    assert choose.last(TABLE, 0.75) == [(l, g) for l in "cb" for g in ("fprop", "dgrad", "wgrad")]
    a, b = choose.at_random(TABLE, 0.25, seed=1), choose.at_random(TABLE, 0.25, seed=1)
    assert a == b and 0 < choose.share(TABLE, a) <= 0.25  # within the ceiling
    # the same draw whatever the table's row order
    shuffled = TABLE.sample(frac=1, random_state=3)
    assert choose.at_random(shuffled, 0.25, seed=1) == a
    sets = choose.random_sets(TABLE, 0.25, 3, avoid=[a])
    assert len({frozenset(s) for s in sets}) == 3 and frozenset(a) not in map(frozenset, sets)
    # last-blocks within the ceiling: c (0.5) does not fit 0.3, so the next deepest, b (0.25)
    assert choose.last(TABLE, 0.3) == [("b", g) for g in ("fprop", "dgrad", "wgrad")]
    assert choose.share(TABLE, choose.last(TABLE, 0.6)) == pytest.approx(0.5)
    assert choose.last(TABLE, 0.2) == []
    # at a budget of 1 every draw is the whole model: no random set differs from it
    whole = list(zip(TABLE["layer"], TABLE["gemm"], strict=True))
    assert choose.random_sets(TABLE, 1.0, 3, avoid=[whole]) == []
    with pytest.raises(ValueError, match="budget"):
        choose.last(TABLE, 0)


class Net(nnx.Module):
    def __init__(self, rngs):
        self.a = nnx.Linear(16, 16, rngs=rngs)
        self.b = nnx.Linear(16, 16, rngs=rngs)
        self.c = nnx.Linear(16, 16, rngs=rngs)


def test_rules_keep_whole_layers_in_hp_and_single_gemms_by_override():
    rules = choose.rules([("c", "fprop"), ("c", "dgrad"), ("c", "wgrad"), ("a", "dgrad")], "nvfp4")
    assert rules[0] == ("c", "bf16") and rules[-1] == (".*", "nvfp4")
    path, recipe = rules[1]
    assert path == "a" and recipe.name == "nvfp4+dgrad=bf16"
    assert recipe.dgrad_dy == fl.recipes.get("bf16").dgrad_dy
    assert recipe.wgrad_dy == fl.recipes.get("nvfp4").wgrad_dy
    model = fl.quantize_model(Net(nnx.Rngs(0)), rules, key=jax.random.key(0))
    assert fl.describe(model).set_index("path")["recipe"].to_dict() == {
        "a": "nvfp4+dgrad=bf16",
        "b": "nvfp4",
        "c": "bf16",
    }
    scope = {}
    chosen = [("c", "fprop"), ("c", "dgrad"), ("c", "wgrad"), ("a", "dgrad")]
    exec("import fp4lab as fl\n" + choose.rules_source(chosen, "nvfp4"), scope)
    assert [(r.path, fl.recipes.get(r.recipe)) for r in scope["rules"]] == [
        (p, fl.recipes.get(r)) for p, r in rules
    ]
    assert scope["rules"][1].recipe.name == "nvfp4+dgrad=bf16"
    fl.Config(recipe="nvfp4", rules=tuple(rules[:-1]))  # a config takes them too


@pytest.mark.parametrize("name", ["nvfp4+mine", "a+wgrad=bf16"])
def test_a_registered_name_holding_plus_round_trips_through_the_rules_text(name):
    """The kept GEMMs are data: a name that looks like a kept recipe's label is only a name."""
    mine = fl.recipes.get("nvfp4").replace(backward="dequantized")
    fl.recipes.register(name, mine)
    try:
        chosen = [("a", "wgrad"), ("b", "fprop"), ("b", "dgrad"), ("b", "wgrad")]
        rules = choose.rules(chosen, name, "bf16", keep=("c",))
        source = choose.rules_source(chosen, name, "bf16", keep=("c",))
    finally:
        fl.recipes.unregister(name)
    scope = {}
    exec("import fp4lab as fl\n" + source, scope)  # registers the name again, on its own
    try:
        got = [(r.path, fl.recipes.get(r.recipe)) for r in scope["rules"]]
        assert got == [(p, fl.recipes.get(r)) for p, r in rules]
        assert got[0] == ("c", None) and got[2] == ("b", fl.recipes.get("bf16"))
        assert got[1][1] == fl.recipes.override(mine, {"wgrad": "bf16"})
        assert got[1][1].name == f"{name}+wgrad=bf16" and got[-1][1] == mine
        assert fl.recipes.get(name) == mine
    finally:
        fl.recipes.unregister(name)


def test_a_higher_ranked_gemm_left_out_is_named_with_its_cost():
    ranked = TABLE.assign(own_error=[0, 0, 5, 0, 0, 0, 9, 0, 1])  # c fprop 9, a wgrad 5, c wgrad 1
    ranked = scores.rank(ranked, "own_error")
    chosen = choose.top(ranked, 1.5 / 12)  # c fprop (2/12) does not fit; a wgrad (1/12) does
    assert chosen == [("a", "wgrad")]
    left = choose.left_out(ranked, chosen)
    assert left[["layer", "gemm", "rank", "why"]].values.tolist() == [["c", "fprop", 1, "budget"]]
    assert left["flop_share"].iloc[0] == pytest.approx(2 / 12)
    assert left["with_it"].iloc[0] == pytest.approx(3 / 12)


def test_the_cheapest_set_reaching_a_predicted_share():
    ranked = scores.rank(TABLE.assign(own_error=[0, 0, 5, 0, 0, 0, 9, 0, 1]), "own_error")
    # c fprop (9 of 15) + a wgrad (5) reach 14/15 > 90 %; a wgrad alone is the cheapest per FLOP
    assert choose.reaching(ranked, 0.9, "own_error") == [("c", "fprop"), ("a", "wgrad")]
    assert choose.reaching(ranked, 0.3, "own_error") == [("a", "wgrad")]  # 5/15, cheapest
    assert choose.predicted_share(ranked, [("a", "wgrad")], "own_error") == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="target"):
        choose.reaching(ranked, 0, "own_error")


def test_the_set_s_predicted_share_is_measured_with_the_set_kept():
    sites = [gate.Site(layer, 0, 0, depth, 1) for depth, layer in enumerate("ab")]
    rows = scores.kept_gates(sites, [("b", "wgrad"), ("a", "fprop")])
    assert rows.tolist() == [[1] * 6, [0, 1, 1, 1, 1, 0]]
    # per sample: the shadow's step decrease, all-FP4's and the set's (step_loss: the loss change)
    shadow = [-1.0, -2.0, -1.0, -4.0]
    fp4 = [-0.5, -1.0, -0.6, -2.0]  # shares lost: 0.5, 0.5, 0.4, 0.5
    kept = [-0.9, -1.8, -0.95, -3.6]  # 0.1, 0.1, 0.05, 0.1
    measured = [
        ({"step_loss": np.array([f, k]), "update_loss": np.array([0.5, 0.25])}, {"step": s})
        for s, f, k in zip(shadow, fp4, kept, strict=True)
    ]
    share, lo, hi, n = scores.kept_share(measured, "alone_step_loss")
    whole, left = np.array([0.5, 0.5, 0.4, 0.5]), np.array([0.1, 0.1, 0.05, 0.1])
    assert n == 4 and share == pytest.approx((whole - left).mean() / whole.mean())  # 0.8
    assert (lo, hi) == pytest.approx(fieller_interval(whole - left, whole))
    assert lo < share < hi
    assert scores.kept_share(measured, "removed_update_loss")[0] == pytest.approx(0.5)
    assert scores.kept_share(measured, "own_error") is None  # no all-FP4 measure to share
