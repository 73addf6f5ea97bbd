"""Do a study's words survive fresh seeds? Its tables' words side by side, row by row.

A study's tables (what its experiment file's `analyze(results)` returns) computed three times:
on the committed runs, on the same cells re-run on fresh seeds (`fp4lab.sweep.fresh`), and
on the two pooled. Each row that carries a word (`WORD_COLUMNS`: a verdict, an overhead's
word, a correlation's "excludes 0", a trend) is read in all three:

    replicated       the fresh seeds give the committed word
    only pooled      they do not, and the pooled seeds do
    not replicated   neither the fresh nor the pooled seeds give it
    not judged       the committed row reads no interval against 0 ("baseline", "too few
                     seeds", ...) or is missing from the fresh tables

A "no evidence" that replicates is still only an absence of evidence. The fresh seeds are as
many as the committed ones, so a word at the edge of its interval fails to replicate about
half the time even when it is right; the pooled word (twice the seeds) says more.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

__all__ = ["WORD_COLUMNS", "KEY_COLUMNS", "JUDGED", "row_words", "compare_words"]

WORD_COLUMNS = ("verdict", "overhead_word", "excludes_0", "trend")
# the columns that name a row, in this order where a table has several
KEY_COLUMNS = ("study", "factor", "kind", "term", "contrast", "metric", "against", "cell")
KEY_COLUMNS += ("cells", "window", "outcome")  # outcome: one cell's rows per instability outcome
JUDGED = ("higher", "lower", "no evidence", "matters", "yes", "no", "falling", "rising")
JUDGED += ("no evidence of a change", "undecided")


def row_words(table: pd.DataFrame) -> dict[str, str]:
    """{row name: word} of a table's rows (the row name joins its `KEY_COLUMNS` with " | ");
    empty when the table has no word column.

    Raises:
      ValueError: two rows share a name (their key columns do not tell them apart), which
        would leave one of them unread.
    """
    column = next((c for c in WORD_COLUMNS if c in table.columns), None)
    keys = [c for c in KEY_COLUMNS if c in table.columns]
    if column is None or not keys:
        return {}
    names = table[keys].astype(str).agg(" | ".join, axis=1)
    twice = sorted(set(names[names.duplicated()]))
    if twice:
        raise ValueError(
            f"row_words: rows {twice[:3]} appear more than once: the columns {keys} do not tell "
            f"them apart (name the rows by one of {list(KEY_COLUMNS)})"
        )
    return dict(zip(names, table[column].fillna("").astype(str), strict=True))


def compare_words(
    committed: Mapping[str, pd.DataFrame],
    fresh: Mapping[str, pd.DataFrame],
    pooled: Mapping[str, pd.DataFrame],
) -> pd.DataFrame:
    """One row per worded row of the committed tables: its word on the committed, fresh and
    pooled seeds and whether it replicated (module docstring).

    Args:
      committed, fresh, pooled: {table name: DataFrame}, e.g. `analyze(results)` of each.
    Returns:
      DataFrame with columns table, row, committed, fresh, pooled, replication.
    """
    rows = []
    for name, table in committed.items():
        new = row_words(fresh.get(name, pd.DataFrame()))
        both = row_words(pooled.get(name, pd.DataFrame()))
        for row, word in row_words(table).items():
            f, p = new.get(row, ""), both.get(row, "")
            if word not in JUDGED or word == "undecided" or not f:
                status = "not judged"
            elif f == word:
                status = "replicated"
            elif p == word:
                status = "only pooled"
            else:
                status = "not replicated"
            rows.append(dict(table=name, row=row, committed=word, fresh=f, pooled=p))
            rows[-1]["replication"] = status
    columns = ["table", "row", "committed", "fresh", "pooled", "replication"]
    return pd.DataFrame(rows, columns=columns)
