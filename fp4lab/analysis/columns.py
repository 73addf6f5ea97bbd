"""The one check of an analysis function's input: the columns it needs, or one line naming them.

The runs and metrics tables of a results folder have one schema (`fp4lab.schema.RUNS_COLUMNS`,
`METRICS_COLUMNS`, docs/schema.md). A public analysis or plot function calls `require` at its
door, so a table without a column it reads fails there with

    MissingColumn: divergence_rate: the runs table has no column 'divergence_kind' (str: "",
    "nonfinite" or "spike"; filled by fp4lab.train.summary.summarize, in fp4lab.load(folder).runs)

instead of a bare KeyError from deep inside pandas.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from fp4lab.schema import METRICS_COLUMNS, RUNS_COLUMNS, RUNS_CONFIG

__all__ = ["METRICS", "MissingColumn", "require", "require_tables"]

_TABLES = {"runs": RUNS_COLUMNS, "metrics": METRICS_COLUMNS}
_WIDE = (
    "to_frame gives telemetry rows (step, layer, gemm, operand, stat, value), not a metrics table"
)


class MissingColumn(KeyError, ValueError):
    """A table without a column a function reads; the message is one line."""

    def __str__(self) -> str:
        return str(self.args[0])


def require(table, columns: Iterable[str], function: str, kind: str = "runs") -> None:
    """Raises MissingColumn naming `function`, the first column of `columns` that `table` lacks
    and what fills it (`kind`: "runs", "metrics", or another table's name).

    Raises:
      TypeError: `table` is not a DataFrame.
    """
    if not isinstance(table, pd.DataFrame):
        raise TypeError(
            f"{function}: the {kind} table is a {type(table).__name__}; need a pandas DataFrame"
        )
    for column in columns:
        if column in table.columns:
            continue
        where = _TABLES.get(kind, {}).get(column)
        if where is None and kind == "runs":
            where = RUNS_CONFIG
        if where is not None:
            kind_, meaning, source = where
            about = f" ({kind_}: {meaning}; filled by {source})"
        else:
            about = ""
        if kind == "metrics" and {"layer", "stat"} <= set(table.columns):
            about += f"; {_WIDE}"
        raise MissingColumn(f"{function}: the {kind} table has no column {column!r}{about}")


METRICS = ("metric", "step", "value", "run_id")  # `METRICS_COLUMNS`, the defining one first


def require_tables(function: str, *, metrics=None, runs=None, needs: Iterable[str] = ()) -> None:
    """`require` for a function of the two tables: every metrics column (when `metrics` is
    given) and the runs columns `needs` (when `runs` is given)."""
    if metrics is not None:
        require(metrics, METRICS, function, "metrics")
    if runs is not None:
        require(runs, needs, function, "runs")
