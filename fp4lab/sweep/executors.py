"""The local executors: cells computed in this process, or in worker processes.

An executor receives the unfinished work, `[(cell, seeds)]`, a `compute(config_dict, seeds)`
function to run on it and a `finish(cell, seeds, results, error)` callback; it never imports
the runner. Workers compute and return plain data; the driver calls `finish`, which writes the
store, so a worker never touches the disk. `fp4lab.sweep.ray` is the cluster executor.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import traceback
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Compute", "Finish", "attempt", "run_local", "run_processes"]

Compute = Callable[[dict[str, Any], list], list[dict]]  # (config dict, seeds) -> [per seed]
Finish = Callable[[Any, list, list[dict] | None, str | None], None]  # (cell, seeds, res, err)


def attempt(
    compute: Compute, config: dict[str, Any], seeds: list
) -> tuple[list | None, str | None]:
    """One try at a cell: (results, None), or (None, traceback) if it raised.

    Only exceptions are caught: a process that dies takes this frame with it (the Ray executor
    then retries the task).
    """
    try:
        return compute(config, seeds), None
    except Exception:
        return None, traceback.format_exc()


def run_local(todo: Sequence[tuple[Any, list]], finish: Finish, compute: Compute) -> None:
    """Computes the cells one after another in this process."""
    for cell, seeds in todo:
        results, error = attempt(compute, cell.config.to_dict(), seeds)
        finish(cell, seeds, results, error)


def run_processes(
    todo: Sequence[tuple[Any, list]], finish: Finish, compute: Compute, workers: int
) -> None:
    """Computes the cells in `workers` fresh processes (compiles of different cells run in
    parallel); `finish` runs here, in completion order."""
    ctx = mp.get_context("spawn")  # a fresh jax per worker (fork after jax init is unsafe)
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {
            pool.submit(attempt, compute, cell.config.to_dict(), seeds): (cell, seeds)
            for cell, seeds in todo
        }
        try:
            for fut in cf.as_completed(futures):
                cell, seeds = futures[fut]
                results, error = fut.result()
                finish(cell, seeds, results, error)
        except BaseException:
            for f in futures:
                f.cancel()
            raise
