"""The fresh-seed replication of the MXFP4 ladder with residual outliers: its words.csv is the
word comparison of the committed, fresh and pooled tables it sits beside, and the counts and
rows that results/README.md and the README state are those of words.csv."""

from pathlib import Path

import pandas as pd

from fp4lab.analysis.replication import compare_words

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "results" / "mxfp4_ladder_lm_outliers"
FRESH = ROOT / "results" / "mxfp4_ladder_lm_outliers_fresh8"
TABLES = ("overhead", "against_all_three", "overhead_train", "gap_hp")


def _tables(folder: Path) -> dict[str, pd.DataFrame]:
    return {name: pd.read_csv(folder / f"{name}.csv") for name in TABLES}


def test_words_are_the_comparison_of_the_tables_beside_them():
    got = compare_words(_tables(STUDY), _tables(FRESH), _tables(FRESH / "pooled"))
    words = pd.read_csv(FRESH / "words.csv", keep_default_na=False)
    pd.testing.assert_frame_equal(got.astype(str), words.astype(str))


def test_the_stated_replications():
    words = pd.read_csv(FRESH / "words.csv").set_index(["table", "row"])["replication"]
    counts = words.value_counts().to_dict()
    assert counts == {"replicated": 24, "not replicated": 2, "only pooled": 2, "not judged": 3}
    assert words[("against_all_three", "all+h16 random signs")] == "replicated"
    assert words[("gap_hp", "all+h16 random signs - fp8")] == "replicated"
    assert words[("overhead", "fprop")] == "not replicated"
    assert words[("against_all_three", "fprop")] == "not replicated"
    assert words[("against_all_three", "all+sr")] == "only pooled"
    assert words[("overhead_train", "all+h32")] == "only pooled"
    fresh = pd.read_csv(FRESH / "against_all_three.csv").set_index("cell")
    row = fresh.loc["all+h16 random signs"]
    assert (round(100 * row.overhead), round(100 * row.overhead_lo)) == (-8, -14)
    assert round(100 * row.overhead_hi) == -2 and row.overhead_word == "lower"
