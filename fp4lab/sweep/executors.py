"""The local executors: cells computed in this process, or in worker processes.

An executor receives the unfinished work, `[(cell, seeds)]`, a `compute(config_dict, seeds)`
function to run on it and a `finish(cell, seeds, results, error)` callback; it never imports
the runner. Workers compute and return plain data; the driver calls `finish`, which writes the
store, so a worker never touches the disk. `fp4lab.sweep.ray` is the cluster executor.

Worker processes end with their parent: each one asks the kernel for SIGKILL when its parent
dies (Linux `PR_SET_PDEATHSIG`) and also watches its parent id, so a `kill -9` of the driver, as
a scheduler's timeout sends, leaves no orphan computing on. On Ctrl-C, SIGTERM (which `fp4lab
run` turns into KeyboardInterrupt) or any error in the driver, the workers are terminated before
the exception goes on.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Compute", "Finish", "attempt", "die_with_parent", "run_local", "run_processes"]

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


def die_with_parent(parent: int) -> None:
    """Makes this process end when the process `parent` does (a worker's initializer).

    On Linux the kernel sends SIGKILL at the parent's death (`prctl(PR_SET_PDEATHSIG)`); on
    every system a daemon thread checks twice a second whether the parent is still this
    process's parent, and exits when not.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def _stop(processes) -> None:
    """Terminates the given worker processes and waits for them (SIGKILL after 5 s)."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1)


def run_processes(
    todo: Sequence[tuple[Any, list]], finish: Finish, compute: Compute, workers: int
) -> None:
    """Computes the work in `workers` fresh processes (compiles of different cells run in
    parallel); `finish` runs here, in completion order. The workers end with this process
    (module docstring); on any exception here they are terminated first."""
    ctx = mp.get_context("spawn")  # a fresh jax per worker (fork after jax init is unsafe)
    before = set(mp.active_children())
    pool = cf.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=ctx,
        initializer=die_with_parent,
        initargs=(os.getpid(),),
    )
    futures = {}
    try:
        for cell, seeds in todo:
            futures[pool.submit(attempt, compute, cell.config.to_dict(), seeds)] = (cell, seeds)
        for fut in cf.as_completed(futures):
            cell, seeds = futures[fut]
            results, error = fut.result()
            finish(cell, seeds, results, error)
    except BaseException:
        for f in futures:
            f.cancel()
        _stop(set(mp.active_children()) - before)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
