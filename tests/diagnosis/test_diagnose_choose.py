"""Sets within a FLOP budget, and rules that quantize_model and Config take as they are."""

import jax
import pandas as pd
import pytest
from flax import nnx

import fp4lab as fl
from fp4lab.diagnosis import choose, scores

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
    assert choose.top(ranked, 0.01) == [("c", "fprop")]  # at least one


def test_last_takes_whole_layers_from_the_deepest_and_random_is_seeded():
    assert choose.last(TABLE, 0.5) == [("c", g) for g in ("fprop", "dgrad", "wgrad")]
    assert choose.last(TABLE, 0.75) == [(l, g) for l in "cb" for g in ("fprop", "dgrad", "wgrad")]
    a, b = choose.at_random(TABLE, 0.25, seed=1), choose.at_random(TABLE, 0.25, seed=1)
    assert a == b and abs(choose.share(TABLE, a) - 0.25) <= 1 / 12 + 1e-12  # the nearest share
    # the same draw whatever the table's row order
    shuffled = TABLE.sample(frac=1, random_state=3)
    assert choose.at_random(shuffled, 0.25, seed=1) == a
    sets = choose.random_sets(TABLE, 0.25, 3, avoid=[a])
    assert len({frozenset(s) for s in sets}) == 3 and frozenset(a) not in map(frozenset, sets)
    # last-blocks at the nearest share: 0.3 is nearer c (0.5) than nothing, 0.6 nearer c than c+b
    assert choose.share(TABLE, choose.last(TABLE, 0.3)) == pytest.approx(0.5)
    assert choose.share(TABLE, choose.last(TABLE, 0.6)) == pytest.approx(0.5)
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
    exec("import fp4lab as fl\n" + choose.rules_source(rules), scope)
    assert [(r.path, fl.recipes.get(r.recipe)) for r in scope["rules"]] == [
        (p, fl.recipes.get(r)) for p, r in rules
    ]
    fl.Config(recipe="nvfp4", rules=tuple(rules[:-1]))  # a config takes them too


def test_a_higher_ranked_gemm_left_out_is_named_with_its_cost():
    ranked = TABLE.assign(own_error=[0, 0, 5, 0, 0, 0, 9, 0, 1])  # c fprop 9, a wgrad 5, c wgrad 1
    ranked = scores.rank(ranked, "own_error")
    chosen = choose.top(ranked, 1.5 / 12)  # c fprop (2/12) does not fit; a wgrad (1/12) does
    assert chosen == [("a", "wgrad")]
    left = choose.skipped(ranked, chosen)
    assert left[["layer", "gemm", "rank"]].values.tolist() == [["c", "fprop", 1]]
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
