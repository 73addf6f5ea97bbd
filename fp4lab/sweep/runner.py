"""Running an experiment: what is left to do, the executors, the store, a progress line.

    fp4lab run experiments/quickstart.py              # the CLI
    fl.sweep.run_experiment(fl.sweep.load_experiment("experiments/quickstart.py"), "results/q")

Finished runs are skipped (a run's id hashes its resolved config and seeds,
`fp4lab.sweep.store.run_id`). Executors compute cells and return arrays; this process writes
the store as each cell finishes. `local` runs cells here, one after another, or in `workers`
processes; `ray` runs them as Ray tasks (`fp4lab.sweep.ray`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from fp4lab.schema import STREAMS
from fp4lab.sweep import executors
from fp4lab.sweep import ray as ray_executor
from fp4lab.sweep import store as S
from fp4lab.sweep.compute import compute_cell
from fp4lab.sweep.executors import Compute
from fp4lab.sweep.experiment import Cell, Experiment, ExperimentError

__all__ = ["EXECUTORS", "Progress", "pending", "run_experiment"]

EXECUTORS = ("local", "ray")


class Progress:
    """One status line on stderr: cells done, runs done, elapsed, ETA, the latest loss."""

    def __init__(self, n_cells: int, n_runs: int, stream=None, enabled: bool = True):
        self.n_cells, self.n_runs = n_cells, n_runs
        self.cells = self.runs = 0
        self.t0 = time.perf_counter()
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.last = ""

    def update(self, cells: int = 0, runs: int = 0, loss: float | None = None, note: str = ""):
        self.cells += cells
        self.runs += runs
        if loss is not None:
            self.last = f"loss {loss:.4f}"
        if not self.enabled:
            return
        el = time.perf_counter() - self.t0
        eta = el / self.cells * (self.n_cells - self.cells) if self.cells else math.nan
        width = 24
        fill = int(width * self.cells / max(self.n_cells, 1))
        bar = "#" * fill + "." * (width - fill)
        line = (
            f"\r[{bar}] cells {self.cells}/{self.n_cells}  runs {self.runs}/{self.n_runs}  "
            f"{_dur(el)} elapsed  ETA {_dur(eta)}  {self.last} {note}"
        )
        self.stream.write(line.ljust(100)[:160])
        self.stream.flush()

    def close(self):
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def _dur(s: float) -> str:
    if not math.isfinite(s):
        return "--"
    s = int(round(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def pending(experiment: Experiment, store: S.Store) -> list[tuple[Cell, list]]:
    """[(cell, seeds not yet finished)] for every cell with work left."""
    todo = []
    for cell in experiment.cells:
        left = [
            s for s, rid in zip(cell.seeds, cell.run_ids(), strict=True) if not store.finished(rid)
        ]
        if left:
            todo.append((cell, left))
    return todo


def _records(experiment, cell, seeds, results, error=None, prov=None) -> Iterable[dict]:
    cfg = cell.config.to_dict()
    for i, s in enumerate(seeds):
        rec = {
            "run_id": S.run_id(cfg, s),
            "experiment": experiment.name,
            "cell": cell.label,
            "overrides": cell.overrides,
            "config": cfg,
            "seeds": dict(zip(STREAMS, (int(v) for v in s), strict=True)),
            "provenance": prov,
        }
        if error is None:
            rec |= {"status": "ok"} | results[i]
        else:
            rec |= {"status": "failed", "error": error, "summary": {}, "wall_s": math.nan}
        yield rec


def run_experiment(
    experiment: Experiment,
    out: str | Path,
    *,
    executor: str = "local",
    workers: int = 1,
    progress: bool = True,
    compute: Compute = compute_cell,
    **executor_options,
) -> dict[str, int]:
    """Runs every unfinished run of `experiment` into the store at `out`.

    Args:
      experiment: from `load_experiment`.
      out: the results folder.
      executor: "local" or "ray"; `executor_options` go to `fp4lab.sweep.ray.run`.
      workers: local worker processes (1: compute in this process).
      progress: draw the progress line on stderr.
      compute: what computes one cell (tests substitute their own).
    Returns:
      Counts {"cells", "runs", "skipped", "done", "failed"}. A cell that raises is recorded
      as failed (with its traceback) and the sweep goes on.
    """
    if executor not in EXECUTORS:
        raise ExperimentError(f"executor={executor!r}; allowed: {', '.join(EXECUTORS)}")
    store = S.Store(out)
    store.write_experiment(experiment.manifest())
    todo = pending(experiment, store)
    n_todo = sum(len(s) for _, s in todo)
    counts = {"cells": len(experiment.cells), "runs": experiment.n_runs}
    counts |= {"skipped": experiment.n_runs - n_todo, "done": 0, "failed": 0}
    bar = Progress(len(todo), n_todo, enabled=progress)
    bar.update(note="compiling" if todo else "nothing to do")
    prov = S.provenance()

    def finish(cell, seeds, results, error):
        for rec in _records(experiment, cell, seeds, results, error, prov):
            store.write(rec)
        counts["failed" if error else "done"] += len(seeds)
        loss = None if error else results[-1]["summary"]["final_loss"]
        bar.update(cells=1, runs=len(seeds), loss=loss, note="(a cell failed)" if error else "")

    try:
        if executor == "ray":
            ray_executor.run(todo, finish, compute, **executor_options)
        elif workers > 1 and len(todo) > 1:
            executors.run_processes(todo, finish, compute, workers)
        else:
            executors.run_local(todo, finish, compute)
    finally:
        bar.close()
    return counts
