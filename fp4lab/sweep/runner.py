"""Running an experiment: what is left to do, the executors, the store, a progress line.

    fp4lab run experiments/quickstart.py              # the CLI
    fl.sweep.run_experiment(fl.sweep.load_experiment("experiments/quickstart.py"), "results/q")

Finished runs are skipped (a run's id hashes its resolved config, seeds, data hashes and the
numerics version, `fp4lab.sweep.store.run_id`). The work is cut into seed batches (a cell's
unfinished seeds, `seed_batch` at a time, the width of one vmapped call), and each batch's
records are written as soon as it finishes, so a kill loses at most the batches in flight.
Executors compute batches and return arrays; this process writes the store. `local` runs them
here, one after another, or in `workers` processes; `ray` runs them as Ray tasks.

A results folder belongs to one experiment: running another experiment into it raises
`FolderTaken` unless `force=True` (the earlier runs then stay on disk as stale runs).
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
from fp4lab.sweep import store as results_store
from fp4lab.sweep.compute import compute_cell
from fp4lab.sweep.executors import Compute
from fp4lab.sweep.experiment import Cell, Experiment, ExperimentError

__all__ = [
    "EXECUTORS",
    "FolderTaken",
    "Progress",
    "batches",
    "check_owner",
    "pending",
    "run_experiment",
]

EXECUTORS = ("local", "ray")


class Progress:
    """One status line on stderr: batches done, runs done, elapsed, ETA, the latest loss."""

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
            f"\r[{bar}] batches {self.cells}/{self.n_cells}  runs {self.runs}/{self.n_runs}  "
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


class FolderTaken(ExperimentError):
    """A results folder that holds another experiment's runs."""


def pending(
    experiment: Experiment,
    store: results_store.Store,
    rerun_stale: bool = False,
    code: str | None = None,
) -> list[tuple[Cell, list]]:
    """[(cell, seeds not yet finished)] for every cell with work left. With `rerun_stale`,
    finished runs whose record another code version made (`store.code_version` differs from
    `code`) count as unfinished."""
    todo = []
    for cell in experiment.cells:
        left = []
        for s, rid in zip(cell.seeds, cell.run_ids(), strict=True):
            record = store.read(rid)
            done = record is not None and record["status"] == "ok"
            if (
                done
                and rerun_stale
                and results_store.code_version(record.get("provenance")) != code
            ):
                done = False
            if not done:
                left.append(s)
        if left:
            todo.append((cell, left))
    return todo


def batches(todo: list[tuple[Cell, list]]) -> list[tuple[Cell, list]]:
    """The work cut into seed batches of each cell's `seed_batch` (one vmapped call each)."""
    out = []
    for cell, seeds in todo:
        width = cell.config.seed_batch
        out.extend((cell, list(seeds[lo : lo + width])) for lo in range(0, len(seeds), width))
    return out


def check_owner(experiment: Experiment, store: results_store.Store, force: bool) -> None:
    """Raises FolderTaken when the folder holds another experiment's runs (unless `force`)."""
    if force:
        return
    manifest = store.experiment()
    if manifest is not None:
        others = {manifest["name"]: manifest.get("file", "?")}
    else:  # no (readable) manifest: the records say whose they are
        others = {r["experiment"]: "?" for r in store.records()}
    others.pop(experiment.name, None)
    if others:
        name, file = next(iter(others.items()))
        raise FolderTaken(
            f"{store.path} holds the results of experiment {name!r} ({file}), not of "
            f"{experiment.name!r} ({Path(experiment.path).name}); choose another --out, or pass "
            "--force to make it this experiment's folder (the earlier runs stay, as stale)"
        )


def _records(experiment, cell, seeds, results, error=None, prov=None) -> Iterable[dict]:
    cfg = cell.config.to_dict()
    for i, s in enumerate(seeds):
        rec = {
            "run_id": results_store.run_id(cfg, s, cell.data),
            "experiment": experiment.name,
            "cell": cell.label,
            "overrides": cell.overrides,
            "config": cfg,
            "seeds": dict(zip(STREAMS, (int(v) for v in s), strict=True)),
            "data": cell.data,
            "numerics": results_store.NUMERICS_VERSION,
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
    force: bool = False,
    rerun_stale: bool = False,
    **executor_options,
) -> dict[str, int]:
    """Runs every unfinished run of `experiment` into the store at `out`.

    Args:
      experiment: from `load_experiment`.
      out: the results folder; it must be empty, new or this experiment's (see `force`).
      executor: "local" or "ray"; `executor_options` go to `fp4lab.sweep.ray.run`.
      workers: local worker processes (1: compute in this process).
      progress: draw the progress line on stderr.
      compute: what computes one seed batch (tests substitute their own).
      force: run into a folder that holds another experiment's runs (they become stale).
      rerun_stale: also recompute finished runs whose records another code version made
        (fp4lab version or git revision, jax, jaxlib; see `fp4lab.sweep.store.code_version`).
        Runs of another numerics version need no flag: their ids differ, so they are redone.
    Returns:
      Counts {"cells", "runs", "skipped", "done", "failed"}. A batch that raises is recorded
      as failed (with its traceback) and the sweep goes on.
    Raises:
      FolderTaken: `out` holds another experiment's runs and not `force`.
      StoreError: the folder cannot be written (read-only, full disk).
    """
    if executor not in EXECUTORS:
        raise ExperimentError(f"executor={executor!r}; allowed: {', '.join(EXECUTORS)}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ExperimentError(f"workers={workers!r}; must be an int >= 1")
    store = results_store.Store(out)
    check_owner(experiment, store, force)
    prov = results_store.provenance()
    todo = pending(experiment, store, rerun_stale, results_store.code_version(prov))
    store.write_experiment(experiment.manifest())
    work = batches(todo)
    n_todo = sum(len(s) for _, s in todo)
    counts = {"cells": len(experiment.cells), "runs": experiment.n_runs}
    counts |= {"skipped": experiment.n_runs - n_todo, "done": 0, "failed": 0}
    bar = Progress(len(work), n_todo, enabled=progress)
    bar.update(note="compiling" if work else "nothing to do")

    def finish(cell, seeds, results, error):
        for rec in _records(experiment, cell, seeds, results, error, prov):
            store.write(rec)
        counts["failed" if error else "done"] += len(seeds)
        loss = None if error else results[-1]["summary"]["final_loss"]
        bar.update(cells=1, runs=len(seeds), loss=loss, note="(a batch failed)" if error else "")

    try:
        if executor == "ray":
            ray_executor.run(work, finish, compute, **executor_options)
        elif workers > 1 and len(work) > 1:
            executors.run_processes(work, finish, compute, workers)
        else:
            executors.run_local(work, finish, compute)
    finally:
        bar.close()
    return counts
