"""Why runs fail, in one line, after they ran (`reason`, `first`); before they run, see
`fp4lab.sweep.experiment.check_cells`. Nothing here loads jax (`fp4lab show` reads it).

A failed run's record holds the traceback of what it raised (`fp4lab.sweep.executors.attempt`);
the progress line, `fp4lab run`'s summary, `plot` and `report` show its last exception line
instead: `reason`. `fp4lab run --dry-run` traces each cell's training run for shapes only
(`jax.eval_shape`: nothing is computed; `fp4lab.sweep.compute.check_cell`, where the sweep
reaches the trainer) and names the cells that would fail, such as a width that a quantizer's
block size does not divide, before anything runs (`fp4lab.sweep.experiment.check_cells`).
"""

from __future__ import annotations

import re
from typing import Any

from fp4lab.sweep.records import StoreError
from fp4lab.sweep.store import Store

__all__ = ["first", "no_finished", "reason"]

# an exception line of a traceback: "ValueError: ...", "jax.errors.Foo: ...", "KeyError"
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(: |$)")


def reason(error: str | None) -> str:
    """The exception line of a traceback (its last one, the error raised; without jax's note
    after it), or the text's last line when it holds none (a Ray failure's message)."""
    lines = [line for line in str(error or "").splitlines() if line.strip()]
    found = [line for line in lines if _EXCEPTION.match(line)]
    return (found or lines or ["(no reason recorded)"])[-1].strip()


def first(results: Any) -> str | None:
    """The failures of a results folder in one line: how many runs failed and the reason of the
    first (`reason`), or None when none failed. `results`: `fp4lab.sweep.store.load`'s value."""
    runs = results.runs
    if runs.empty or not (runs["status"] == "failed").any():
        return None
    failed = runs[runs["status"] == "failed"]
    row = failed.iloc[0]
    try:
        record = Store(results.path).read(row["run_id"], metrics=False) or {}
    except (OSError, StoreError):
        record = {}
    return (
        f"{len(failed)} failed of {len(runs)} runs; the first (cell {row['cell']}): "
        f"{reason(record.get('error'))}"
    )


def no_finished(results: Any) -> bool:
    """Whether the folder's runs hold no finished ("ok") run."""
    runs = results.runs
    return runs.empty or not (runs["status"] == "ok").any()
