"""Running an experiment: what is left to do, the executors, the store (the progress display:
`fp4lab.sweep.progress`).

    fp4lab run experiments/quickstart.py              # the CLI
    fl.sweep.run_experiment(fl.sweep.load_experiment("experiments/quickstart.py"), "results/q")

Finished runs are skipped (a run's id hashes its resolved config, seeds, data hashes and the
numerics version, `fp4lab.sweep.store.run_id`). The work is cut into seed batches (a cell's
unfinished seeds, `seed_batch` at a time, one compiled call), and each batch's
records are written as soon as it finishes, so a kill loses at most the batches in flight.
Executors compute batches and return arrays; this process writes the store. `local` runs them
here, one after another, or in `workers` processes; `ray` runs them as Ray tasks.

A results folder belongs to one experiment: running another experiment into it raises
`FolderTaken` unless `force=True` (the earlier runs then stay on disk as stale runs).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
from collections.abc import Iterable
from pathlib import Path

from fp4lab.schema import STREAMS
from fp4lab.sweep import compute as cells_compute
from fp4lab.sweep import executors, failures, lock
from fp4lab.sweep import ray as ray_executor
from fp4lab.sweep import store as results_store
from fp4lab.sweep.compute import call_width
from fp4lab.sweep.executors import Compute
from fp4lab.sweep.experiment import Cell, Experiment, ExperimentError
from fp4lab.sweep.progress import Progress
from fp4lab.sweep.stream import STREAM_FIELDS, STREAM_FILE, Stream

__all__ = [
    "EXECUTORS",
    "FolderTaken",
    "Progress",
    "STREAM_FIELDS",
    "STREAM_FILE",
    "batches",
    "check_owner",
    "pending",
    "run_experiment",
]

EXECUTORS = ("local", "ray")


class FolderTaken(ExperimentError):
    """A results folder that holds another experiment's runs."""


def pending(
    experiment: Experiment,
    store: results_store.Store,
    rerun_stale: bool = False,
    code: str | None = None,
) -> list[tuple[Cell, list, list[str]]]:
    """[(cell, seeds not yet finished, their run ids)] for every cell with work left, from the
    folder's index (no record is opened). With `rerun_stale`, finished runs whose record
    another code version made (`store.code_version` differs from `code`) count as
    unfinished."""
    known = store.statuses()
    todo = []
    for cell in experiment.cells:
        left, ids = [], []
        for s, rid in zip(cell.seeds, cell.run_ids(), strict=True):
            status, made_by = known.get(rid, (None, None))
            if status != "ok" or (rerun_stale and made_by != code):
                left.append(s)
                ids.append(rid)
        if left:
            todo.append((cell, left, ids))
    return todo


def batches(todo: list[tuple[Cell, list, list[str]]]) -> list[tuple[Cell, list, list[str]]]:
    """The work cut into seed batches of each cell's `seed_batch` (one compiled call each):
    (cell, seeds, their run ids). Where a call is only as wide as its seeds
    (`compute.sequential`), a cell's seeds are cut into equal batches, the widest of at most
    `seed_batch` that divides them (9 seeds at 4: 3 + 3 + 3), so that the cell compiles one
    program, not a second for a remainder (4 + 4 + 1); a vmapped call is `seed_batch` wide
    anyway (the last one padded)."""
    out = []
    for cell, seeds, ids in todo:
        width = cell.config.seed_batch
        if len(seeds) > width and cells_compute.sequential(cell.config):
            width = max(w for w in range(1, width + 1) if len(seeds) % w == 0)
        for lo in range(0, len(seeds), width):
            out.append((cell, list(seeds[lo : lo + width]), ids[lo : lo + width]))
    return out


def _from(folder: Path, experiment: Experiment) -> str:
    """The experiment file's path from the results folder (`fp4lab replicate` finds it from any
    working folder): relative, so that a committed folder names no machine's paths."""
    return Path(os.path.relpath(Path(experiment.path).resolve(), Path(folder).resolve())).as_posix()


def check_owner(experiment: Experiment, store: results_store.Store, force: bool) -> None:
    """Raises FolderTaken when the folder holds another experiment's runs (unless `force`)."""
    if force:
        return
    manifest = store.experiment()
    if manifest is not None:
        others = {manifest["name"]: manifest.get("file", "?")}
    else:  # no (readable) manifest: the records say whose they are
        others = {r["experiment"]: "?" for r in store.summaries()}
    others.pop(experiment.name, None)
    if others:
        name, file = next(iter(others.items()))
        raise FolderTaken(
            f"{store.path} holds the results of experiment {name!r} ({file}), not of "
            f"{experiment.name!r} ({Path(experiment.path).name}); choose another --out, or pass "
            "--force to make it this experiment's folder (the earlier runs stay, as stale)"
        )


def _records(experiment, batch, results, error=None, prov=None) -> Iterable[dict]:
    cell, seeds, ids = batch
    cfg = cell.config.to_dict()
    for i, (s, rid) in enumerate(zip(seeds, ids, strict=True)):
        rec = {
            "run_id": rid,
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
            result = dict(results[i])
            if "cpu" in result:  # the CPU that computed it (a Ray worker's), not the driver's
                rec["provenance"] = {**(prov or {}), "cpu": result.pop("cpu")}
            rec |= {"status": "ok"} | result
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
    compute: Compute | None = None,
    force: bool = False,
    rerun_stale: bool = False,
    progress_every: int | None = 0,
    stream: bool = False,
    **executor_options,
) -> dict[str, int]:
    """Runs every unfinished run of `experiment` into the store at `out`.

    Args:
      experiment: from `load_experiment`.
      out: the results folder; it must be empty, new or this experiment's (see `force`).
      executor: "local" or "ray"; `executor_options` go to `fp4lab.sweep.ray.run`.
      workers: local worker processes (1: compute in this process).
      progress: show the progress on stderr (`Progress`): live on a terminal, plain lines
        otherwise.
      compute: what computes one seed batch (tests substitute their own); one that takes a
        `progress` keyword (`compute_cell`) reports compiles and steps from inside a batch.
      progress_every: steps between two reports from inside a batch (0, the default: none,
        only whole batches move the display; None: about 50 per run). Reports change no number
        (tested bit for bit); on the CPU they go through a kernel's queue and the compile
        caches keep their programs (`fp4lab.sweep.compute.compute_cell`). Needs the local
        executor.
      stream: append each reported step of each run to `<out>/stream.jsonl` while the sweep
        runs, one JSON object a line (`STREAM_FIELDS`); implies step reports.
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
    if progress_every is not None and (
        isinstance(progress_every, bool)
        or not isinstance(progress_every, int)
        or progress_every < 0
    ):
        raise ExperimentError(f"progress_every={progress_every!r}; must be an int >= 0")
    if stream and progress_every == 0:
        raise ExperimentError("stream=True needs step reports; progress_every=0 turns them off")
    if executor == "ray":  # every argument checked before anything is written
        ray_executor.check_options(**executor_options)
    elif executor_options:
        raise ExperimentError(f"{', '.join(executor_options)}: options of the ray executor only")
    # looked up at each call, not bound when this module was imported (a test's substitute
    # installed at that moment would have stayed the default)
    compute = cells_compute.compute_cell if compute is None else compute
    store = results_store.Store(out)
    with lock.writer(store.path), contextlib.closing(store):  # one writer per folder (`lock`)
        return _sweep(
            experiment,
            store,
            executor,
            workers,
            progress,
            compute,
            force,
            rerun_stale,
            progress_every,
            stream,
            executor_options,
        )


def _sweep(
    experiment,
    store,
    executor,
    workers,
    progress,
    compute,
    force,
    rerun_stale,
    progress_every,
    stream,
    executor_options,
) -> dict[str, int]:
    """`run_experiment` with the folder's writer lock held."""
    check_owner(experiment, store, force)
    prov = results_store.provenance()
    todo = pending(experiment, store, rerun_stale, results_store.code_version(prov))
    store.write_experiment(experiment.manifest() | {"from_folder": _from(store.path, experiment)})
    work = batches(todo)
    n_todo = sum(len(s) for _, s, _ in todo)
    counts = {"cells": len(experiment.cells), "runs": experiment.n_runs}
    counts |= {"skipped": experiment.n_runs - n_todo, "done": 0, "failed": 0}
    in_cell = executor == "local" and (progress or stream)  # compiles shown, steps if asked
    if progress_every is not None and "every" in _parameters(compute):
        compute = functools.partial(compute, every=progress_every)
    labels = [f"{cell.label} (seeds {_seed_range(seeds)})" for cell, seeds, _ in work]
    # batches sharing a compiled program: one per config and call width (`call_width`)
    shapes = [(cell.config, call_width(cell.config, len(seeds))) for cell, seeds, _ in work]
    programs = {shape: i for i, shape in enumerate(shapes)}
    bar = Progress(
        len(work),
        n_todo,
        enabled=progress,
        labels=labels,
        steps=[cell.config.steps for cell, _, _ in work],
        seeds=[list(seeds) for _, seeds, _ in work],
        compiles=[programs[shape] for shape in shapes],
        parallel=workers if executor == "local" else 1,
    )
    if not work:
        bar.update(note="nothing to do")
    streamer = Stream(store.path / STREAM_FILE, work) if stream else None

    def on_event(index, event):
        bar.event(index, event)
        if streamer is not None:
            streamer.write(index, event)

    def finish(index, results, error):
        for rec in _records(experiment, work[index], results, error, prov):
            store.write(rec)
        seeds = work[index][1]
        counts["failed" if error else "done"] += len(seeds)
        loss = None if error else results[-1]["summary"]["final_loss"]
        note = f"failed: {failures.reason(error)}" if error else ""
        bar.update(cells=1, runs=len(seeds), loss=loss, note=note, index=index)

    sink = on_event if in_cell else None
    cells = [(cell, seeds) for cell, seeds, _ in work]
    try:
        if executor == "ray":
            ray_executor.run(cells, finish, compute, **executor_options)
        elif workers > 1 and len(work) > 1:
            executors.run_processes(cells, finish, compute, workers, sink)
        else:
            executors.run_local(cells, finish, compute, sink)
    finally:
        bar.close()
        if streamer is not None:
            streamer.close()
    return counts


def _parameters(fn) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _seed_range(seeds: list) -> str:
    """The seeds of a batch in brief: their init seeds ("0-3", "4", "0,2,5"), or, where init
    seeds repeat (a crossed design), the triples' count and the init seeds ("9 triples, init
    0-2")."""
    first = [int(s[0]) for s in seeds]
    if len(set(first)) < len(first):
        return f"{len(seeds)} triples, init {_seed_range([(i,) for i in sorted(set(first))])}"
    if len(first) > 1 and first == list(range(first[0], first[-1] + 1)):
        return f"{first[0]}-{first[-1]}"
    return ",".join(map(str, first))
