"""Why runs fail, in one line: before they run (`check_cell`) and after (`reason`, `first`).

A failed run's record holds the traceback of what it raised (`fp4lab.sweep.executors.attempt`);
the progress line, `fp4lab run`'s summary, `plot` and `report` show its last exception line
instead: `reason`. `fp4lab run --dry-run` traces each cell's training run for shapes only
(`jax.eval_shape`: nothing is computed) and names the cells that would fail, such as a width that
a quantizer's block size does not divide, before anything runs: `check_cell`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from fp4lab.sweep.experiment import Cell, ExperimentError
from fp4lab.sweep.records import StoreError
from fp4lab.sweep.store import Store
from fp4lab.train.config import Config

__all__ = ["check_cell", "check_cells", "first", "no_finished", "reason"]

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


def check_cell(config: Config) -> str | None:
    """The reason (one line) why a cell's training run would fail at its start, or None.

    Traces the run (`make_train(config)` on seeds (0, 0, 0)) with `jax.eval_shape`: every shape
    and static check of the step, the phases and the evaluation runs, nothing is computed.
    Catches the errors a config raises before any number exists (a width the block size of a
    quantizer does not divide, a layout the recipe cannot take)."""
    import jax  # lazy: `import fp4lab.sweep` loads no jax

    from fp4lab.train import trainer

    try:
        jax.eval_shape(trainer.make_train(config), trainer.make_keys(0, 0, 0))
    except (ValueError, TypeError, NotImplementedError) as e:
        text = str(e).strip().splitlines()
        return f"{type(e).__name__}: {text[0] if text else ''}"
    return None


def check_cells(cells: Iterable[Cell]) -> None:
    """Raises ExperimentError (one line: where, which cell, why) for the first cell whose run
    would fail at its start (`check_cell`)."""
    for cell in cells:
        if why := check_cell(cell.config):
            raise ExperimentError(f"{cell.where}: cell {cell.label} would fail: {why}")


def no_finished(results: Any) -> bool:
    """Whether the folder's runs hold no finished ("ok") run."""
    runs = results.runs
    return runs.empty or not (runs["status"] == "ok").any()
