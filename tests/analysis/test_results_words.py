"""The words in the committed tables are their intervals' words, converged; the families the
text states are the tables' own.

Words: every CSV under results/ with a word column (`verdict`, `overhead_word`, `excludes_0`,
`trend`) has, in every row whose word reads an interval against 0, the word that
`montecarlo.side_word` gives from the row's ends and their Monte Carlo standard errors: no
decided word has its deciding end within `MC_SES` standard errors of 0. Intervals without a
Monte Carlo error (t, Welch, Fieller) count with 0, as their `*_mcse` columns say. The LM
studies' tables must carry the Monte Carlo columns of every interval that has one.

Families: every LM table with an interval carries `family`, the number of intervals its
Bonferroni level covers; every "Bonferroni over N" in results/README.md and the README names a
family of a table that its row cites.
"""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fp4lab.analysis.montecarlo import MC_SES, side_word

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
LM = ("mxfp4_ladder_lm", "mxfp4_ladder_lm_outliers", "nvfp4_sensitivity_lm")
LM += ("randomness_vs_error_lm", "sqrt3_lm", "diagnose_lm", "diagnose_lm_outliers")
# word column -> (lo, hi, Monte Carlo error columns or None for an exact interval, the words
# as side_word's: higher, lower, no evidence, undecided)
WORDS = {
    "verdict": ("lo", "hi", ("lo_mcse", "hi_mcse"), {}),
    "overhead_word": ("overhead_lo", "overhead_hi", ("overhead_mcse", "overhead_mcse"), {}),
    "excludes_0": ("lo", "hi", ("lo_mcse", "hi_mcse"), {"yes": ("higher", "lower")}),
    "trend": ("lo", "hi", None, {"falling": ("higher",), "rising": ("lower",)}),
}
SIDE = ("higher", "lower", "no evidence", "undecided")
CSVS = sorted(RESULTS.glob("*/*.csv"))


def _same(word: str, computed: str, aliases: dict) -> bool:
    if word in aliases:
        return computed in aliases[word]
    if word in ("no", "no evidence of a change"):
        return computed == "no evidence"
    return word == computed


def _judged(table: pd.DataFrame, column: str, lo: str, hi: str, aliases: dict) -> pd.DataFrame:
    """Rows whose word reads an interval against 0 (not "baseline", "too few seeds", ...)."""
    if lo not in table or hi not in table:
        return table.iloc[:0]
    rows = table[table[column].notna()]
    if "kind" in rows:  # a verdict: the stream rows' words read an F-test and an SD's interval
        rows = rows[rows["kind"] == "fixed"]
    known = (*SIDE, *aliases, "no", "no evidence of a change")
    return rows[rows[column].astype(str).isin(known)]


@pytest.mark.parametrize("path", CSVS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_word_is_its_converged_interval(path):
    table = pd.read_csv(path)
    lm = path.parent.name in LM
    for column, (lo, hi, mcse, aliases) in WORDS.items():
        if column not in table:
            continue
        if column == "verdict" and "lo" not in table and "diff_lo" in table:  # a paired diff
            lo, hi, mcse = "diff_lo", "diff_hi", ("diff_mcse", "diff_mcse")
        if lo not in table or hi not in table:
            continue
        rows = _judged(table, column, lo, hi, aliases)
        if mcse is not None and not set(mcse) <= set(table.columns):
            # an older MLP table written before the Monte Carlo columns; the LM's have them
            assert not lm, f"{path.name}: {column} without {mcse}"
            se = np.zeros((len(rows), 2))
        else:
            se = np.zeros((len(rows), 2)) if mcse is None else rows[list(mcse)].to_numpy(float)
        for (_, row), (lo_se, hi_se) in zip(rows.iterrows(), se, strict=True):
            computed = side_word(row[lo], row[hi], lo_se, hi_se)
            assert _same(str(row[column]), computed, aliases), (
                f"{path.name}: {row.to_dict()} reads {row[column]!r}, its interval {computed!r} "
                f"(deciding end within {MC_SES} Monte Carlo standard errors of 0: 'undecided')"
            )


def _has_interval(table: pd.DataFrame) -> bool:
    return any(c == "lo" or c.endswith("_lo") for c in table.columns)


@pytest.mark.parametrize("study", LM)
def test_every_lm_table_with_an_interval_states_its_family(study):
    tables = {p.name: pd.read_csv(p) for p in sorted((RESULTS / study).glob("*.csv"))}
    with_intervals = {name: t for name, t in tables.items() if _has_interval(t)}
    assert with_intervals, study
    for name, table in with_intervals.items():
        assert "family" in table and (table["family"] >= 1).all(), f"{study}/{name}"


CITED = re.compile(r"`([\w/.-]+(?:\.csv|/))`")  # a table, or a folder the next ones are in
STATED = re.compile(r"Bonferroni over (\d+)")


def _families(path: Path) -> set[int]:
    table = pd.read_csv(path)
    column = "family" if "family" in table else "rows" if "rows" in table else None
    return set() if column is None else {int(v) for v in table[column].dropna()}


def _rows(text: str) -> list[str]:
    """Table rows and paragraphs: the units in which a statement and its files are cited."""
    return [row for row in re.split(r"\n(?=\||- )|\n\n", text) if STATED.search(row)]


@pytest.mark.parametrize("document", ["results/README.md", "README.md"])
def test_every_stated_family_is_a_cited_table_s(document):
    text = (ROOT / document).read_text()
    checked = 0
    for row in _rows(text):
        folder, files = None, []
        for cited in CITED.findall(row):
            folder = cited.split("/")[0] if "/" in cited else folder
            if cited.endswith(".csv") and folder:
                files.append(RESULTS / folder / Path(cited).name)
        families = set().union(*(_families(f) for f in files if f.exists()))
        for stated in STATED.findall(row):
            assert families, f"{document}: 'Bonferroni over {stated}' cites no table with a family"
            assert int(stated) in families, (
                f"{document}: 'Bonferroni over {stated}' but the cited tables' families are "
                f"{sorted(families)}: {row[:160]}"
            )
            checked += 1
    assert checked or document == "README.md"
