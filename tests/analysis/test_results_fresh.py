"""The fresh-seed replications of the LM and instability studies: each words.csv is the word
comparison of the committed, fresh and pooled tables it sits beside, and the counts and rows
that results/README.md and the README state are those of words.csv."""

from pathlib import Path

import pandas as pd
import pytest

from fp4lab.analysis.replication import compare_words

ROOT = Path(__file__).resolve().parents[2] / "results"
STUDIES = {  # (study, seeds_from): its worded tables
    ("mxfp4_ladder_lm_outliers", 8): ("overhead", "against_all_three", "overhead_train", "gap_hp"),
    ("mxfp4_ladder_lm", 8): ("overhead", "overhead_train", "gap_hp"),
    ("randomness_vs_error_lm", 10): ("verdict", "link", "cells"),
    ("instability_proxy", 8): ("contrasts",),
    ("instability_streams", 6): ("attribution",),
    ("instability_outputs", 8): ("contrasts",),
}


def _tables(folder: Path, names) -> dict[str, pd.DataFrame]:
    return {name: pd.read_csv(folder / f"{name}.csv") for name in names}


@pytest.mark.parametrize("study, seeds_from", sorted(STUDIES))
def test_words_are_the_comparison_of_the_tables_beside_them(study, seeds_from):
    fresh, names = ROOT / f"{study}_fresh{seeds_from}", STUDIES[study, seeds_from]
    got = compare_words(
        _tables(ROOT / study, names), _tables(fresh, names), _tables(fresh / "pooled", names)
    )
    words = pd.read_csv(fresh / "words.csv", keep_default_na=False)
    pd.testing.assert_frame_equal(got.astype(str), words.astype(str))


def _words(study: str, seeds_from: int = 8) -> pd.Series:
    words = pd.read_csv(ROOT / f"{study}_fresh{seeds_from}" / "words.csv")
    return words.set_index(["table", "row"])["replication"]


def test_the_stated_replications_with_outliers():
    words = _words("mxfp4_ladder_lm_outliers")
    counts = words.value_counts().to_dict()
    assert counts == {"replicated": 24, "not replicated": 2, "only pooled": 2, "not judged": 3}
    assert words[("against_all_three", "all+h16 random signs")] == "replicated"
    assert words[("gap_hp", "all+h16 random signs - fp8")] == "replicated"
    assert words[("overhead", "fprop")] == "not replicated"
    assert words[("against_all_three", "fprop")] == "not replicated"
    assert words[("against_all_three", "all+sr")] == "only pooled"
    assert words[("overhead_train", "all+h32")] == "only pooled"
    fresh = pd.read_csv(ROOT / "mxfp4_ladder_lm_outliers_fresh8" / "against_all_three.csv")
    row = fresh.set_index("cell").loc["all+h16 random signs"]
    assert (round(100 * row.overhead), round(100 * row.overhead_lo)) == (-8, -14)
    assert round(100 * row.overhead_hi) == -2 and row.overhead_word == "lower"


def test_the_stated_replications_without_outliers():
    words = _words("mxfp4_ladder_lm")
    assert words.value_counts().to_dict() == {
        "replicated": 20,
        "not replicated": 1,
        "not judged": 2,
    }
    assert words[("gap_hp", "fprop - fp8")] == "not replicated"
    assert (words.xs("overhead", level="table").drop("fp8") == "replicated").all()
    fresh = ROOT / "mxfp4_ladder_lm_fresh8"
    gap = pd.read_csv(fresh / "gap_hp.csv").set_index("term").loc["fprop - fp8"]
    assert (gap.verdict, round(gap.effect, 4), round(gap.lo, 4)) == ("higher", 0.0025, 0.0007)
    held_out = pd.read_csv(fresh / "overhead.csv").set_index("cell")
    assert (held_out.overhead_word.drop("fp8") == "no evidence").all()
    train = pd.read_csv(fresh / "overhead_train.csv").set_index("cell")
    assert [
        round(100 * train.overhead[c]) for c in ("fprop", "fprop+dgrad", "fprop+dgrad+wgrad")
    ] == [4, 12, 15]


def test_the_stated_replications_of_randomness_or_error_on_the_lm():
    words = _words("randomness_vs_error_lm", 10)
    counts = words.value_counts().to_dict()
    assert counts == {"replicated": 28, "not replicated": 1, "not judged": 5}
    assert words[("verdict", "init | random | nvfp4-no-sr wgrad=bf16")] == "not replicated"
    for cell in ("nvfp4", "nvfp4-no-sr random signs"):  # the quant seed's own SD, both ways
        assert words[("verdict", f"quant | random | {cell}")] == "replicated"
    folder = ROOT / "randomness_vs_error_lm_fresh10"
    fresh = pd.read_csv(folder / "verdict.csv").set_index(["factor", "term"])
    pooled = pd.read_csv(folder / "pooled" / "verdict.csv").set_index(["factor", "term"])
    quant = fresh.loc[("quant", "nvfp4")]
    assert (quant.verdict, round(quant.hi, 3)) == ("no evidence", 0.045)
    assert round(fresh.loc[("quant", "nvfp4-no-sr random signs")].hi, 3) == 0.078
    bf16 = fresh.loc[("recipe", "bf16 - nvfp4-no-sr")]
    assert [round(bf16[c], 3) for c in ("effect", "lo", "hi")] == [-0.254, -0.318, -0.191]
    assert fresh["family"].iloc[0] == 22 and pooled["family"].iloc[0] == 6
    four = pooled.loc[("recipe", "nvfp4-no-sr four-over-six - nvfp4-no-sr")]
    assert four.verdict == "lower" and round(four.hi, 4) == -0.0027
    assert (pooled.loc["init"].verdict == "unbalanced").all()


def test_the_stated_replications_of_the_quantized_activations():
    words = _words("instability_outputs")
    assert words.value_counts().to_dict() == {"replicated": 8}
    assert words[("contrasts", "bf16+ln+out vs bf16+ln | spiked")] == "replicated"
    fresh = pd.read_csv(ROOT / "instability_outputs_fresh8" / "contrasts.csv")
    row = fresh.set_index("contrast").loc["bf16+ln+out vs bf16+ln"]
    assert (row.k_a, row.k_b, row.verdict, round(row.p, 4)) == (0, 7, "lower", 0.0014)
