"""The local executors: cells computed in this process, or in worker processes.

An executor receives the unfinished work, `[(cell, seeds)]`, a `compute(config_dict, seeds)`
function to run on it and a `finish(index, results, error)` callback, `index` being the batch's
place in the work list (the runner knows its cell, seeds and run ids); it never imports the
runner. Workers compute and return plain data; the driver calls `finish`, which writes the
store, so a worker never touches the disk. `fp4lab.sweep.ray` is the cluster executor.

Progress: given a `progress(index, event)` sink and a `compute` that takes a `progress`
keyword (`compute_cell` does), the local executors hand each batch's events (compile, steps;
plain dicts) to the sink, tagged with the batch's index in the work list: directly in this
process, through a queue from worker processes (a driver thread passes them on).

Worker processes end with their parent: each one asks the kernel for SIGKILL when its parent
dies (Linux `PR_SET_PDEATHSIG`) and also watches its parent id, so a `kill -9` of the driver, as
a scheduler's timeout sends, leaves no orphan computing on. On Ctrl-C, SIGTERM (which `fp4lab
run` turns into KeyboardInterrupt) or any error in the driver (a full disk), the workers are
terminated before the exception goes on, and no thread of the pool prints a traceback after it.
multiprocessing's resource tracker, which unlinks the pool's semaphores if the driver ends
without doing so (`fp4lab` ends an interrupted command with `os._exit`), is started with its
stderr at /dev/null: its "leaked semaphore" warnings after a Ctrl-C named nothing a user could
act on, and the semaphores are unlinked all the same.
A worker that dies on its own loses the batches in flight; they are retried in new workers
(`run_processes`), as the Ray executor retries a task whose worker died.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import ctypes
import functools
import inspect
import multiprocessing as mp
import os
import queue as queue_module
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any

__all__ = [
    "Compute",
    "Finish",
    "MAX_RETRIES",
    "Sink",
    "attempt",
    "die_with_parent",
    "run_local",
    "run_processes",
    "takes_progress",
]

Compute = Callable[[dict[str, Any], list], list[dict]]  # (config dict, seeds) -> [per seed]
Finish = Callable[[int, list[dict] | None, str | None], None]  # (index in the work, res, err)
Sink = Callable[[int, dict[str, Any]], None]  # (index of the batch in the work, event)
_QUEUE: list = [None]  # in a worker process: where its progress events go
MAX_RETRIES = 3  # tries of a batch whose worker process died, after the first (as Ray's default)


def takes_progress(compute: Compute) -> bool:
    """Whether `compute` accepts a `progress` keyword (it then reports events while it runs)."""
    try:
        return "progress" in inspect.signature(compute).parameters
    except (TypeError, ValueError):
        return False


def attempt(
    compute: Compute, config: dict[str, Any], seeds: list, progress=None
) -> tuple[list | None, str | None]:
    """One try at a cell: (results, None), or (None, traceback) if it raised. `progress`, when
    given, is passed on to `compute` (which must take it).

    Only exceptions are caught: a process that dies takes this frame with it (the Ray executor
    then retries the task).
    """
    try:
        if progress is None:
            return compute(config, seeds), None
        return compute(config, seeds, progress=progress), None
    except Exception:
        return None, traceback.format_exc()


def run_local(
    todo: Sequence[tuple[Any, list]],
    finish: Finish,
    compute: Compute,
    progress: Sink | None = None,
) -> None:
    """Computes the cells one after another in this process."""
    report = progress is not None and takes_progress(compute)
    for i, (cell, seeds) in enumerate(todo):
        sink = functools.partial(progress, i) if report else None
        results, error = attempt(compute, cell.config.to_dict(), seeds, sink)
        finish(i, results, error)


class _Forward:
    """A worker's progress reporter for batch `index`: puts (index, event) on the queue its
    process was started with (picklable, so it travels with the task)."""

    def __init__(self, index: int):
        self.index = index

    def __call__(self, event: dict[str, Any]) -> None:
        if _QUEUE[0] is not None:
            _QUEUE[0].put((self.index, event))


def _start_worker(parent: int, events) -> None:
    die_with_parent(parent)
    _QUEUE[0] = events


def _pass_on(events, progress: Sink, stop: threading.Event) -> None:
    """The driver thread that hands the workers' events to `progress` until `stop`."""
    while not stop.is_set():
        try:
            index, event = events.get(timeout=0.1)
        except queue_module.Empty:
            continue
        except Exception:  # EOF, or a message cut short by a worker that died while it wrote
            return
        try:
            progress(index, event)
        except Exception:
            return


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


def _quiet_resource_tracker() -> None:
    """Starts multiprocessing's resource tracker (once per process) with stderr at /dev/null
    (module docstring); a tracker already running is left as it is."""
    from multiprocessing import resource_tracker

    sys.stderr.flush()
    try:
        saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:  # no stderr to redirect (closed): the tracker starts as it would
        return
    try:
        os.dup2(devnull, 2)
        resource_tracker.ensure_running()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


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
    todo: Sequence[tuple[Any, list]],
    finish: Finish,
    compute: Compute,
    workers: int,
    progress: Sink | None = None,
    max_retries: int = MAX_RETRIES,
) -> None:
    """Computes the work in `workers` fresh processes (compiles of different cells run in
    parallel); `finish` runs here, in completion order. The workers end with this process
    (module docstring); on any exception here they are terminated first.

    A worker process that dies (a `kill -9`, an out-of-memory kill, a segfault) breaks the pool:
    the batches in flight (at most `workers`) are lost, and a new pool is started. Which of them
    lost its worker is unknown, so after such a break each of them runs again alone; a batch
    whose worker dies while it runs alone is retried at most `max_retries` times, then finished
    as failed with a message saying so, and the sweep goes on. Each break is one line on stderr.
    """
    ctx = mp.get_context("spawn")  # a fresh jax per worker (fork after jax init is unsafe)
    _quiet_resource_tracker()
    before = set(mp.active_children())
    report = progress is not None and takes_progress(compute)
    left = collections.deque(range(len(todo)))  # indices of the batches still to compute
    alone: collections.deque = collections.deque()  # lost ones: each runs by itself next
    lost = [0] * len(todo)  # how often each batch's worker died while it ran alone
    pool = None
    try:
        while left or alone:
            queue, width = (alone, 1) if alone else (left, min(workers, len(left)))
            # a fresh queue per pool: a worker killed while it wrote may leave a queue locked
            events = ctx.Queue() if report else None
            pool = cf.ProcessPoolExecutor(
                max_workers=width,
                mp_context=ctx,
                initializer=_start_worker,
                initargs=(os.getpid(), events),
            )
            stop = threading.Event()
            if report:
                threading.Thread(
                    target=_pass_on, args=(events, progress, stop), name="progress", daemon=True
                ).start()
            try:
                broken = _drain(pool, todo, queue, finish, compute, width, report)
            finally:
                stop.set()
            pool.shutdown(wait=True)  # a broken pool has terminated its workers already
            pool = None
            if len(broken) > 1:  # several in flight: each runs alone next, charged nothing
                alone.extend(broken)
                then = f"running each of them again alone (max_retries={max_retries})"
            elif broken:
                (i,) = broken
                lost[i] += 1
                if lost[i] <= max_retries:
                    queue.appendleft(i)
                    then = f"retrying it in a new worker (try {lost[i] + 1} of {max_retries + 1})"
                else:
                    why = f"the worker computing this batch died each time ({lost[i]} times)"
                    finish(i, None, f"{why}; {max_retries=}")
                    then = f"recorded as failed after {lost[i]} tries"
            if broken:
                print(
                    f"a worker process died: {len(broken)} batch(es) in flight lost, {then}",
                    file=sys.stderr,
                    flush=True,
                )
    except BaseException:
        # Shut the pool down before its workers are terminated, and cancel no future here: the
        # pool's own thread fails the futures of the workers it loses, and a future cancelled
        # under it raises InvalidStateError in that thread (a traceback after ours).
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        _stop(set(mp.active_children()) - before)
        raise


@contextlib.contextmanager
def _deaf_to_ctrl_c():
    """SIGINT blocked in this thread meanwhile, so that a worker started here inherits the
    mask through its spawn and never takes a Ctrl-C: the terminal sends it to the whole
    process group, and a worker that took it printed a traceback ending in KeyboardInterrupt
    (or an `_xla_gc_callback` fragment). The driver alone takes it and stops the workers; a
    Ctrl-C that arrives meanwhile waits for the mask to lift, it is not lost."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    saved = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, saved)


def _drain(pool, todo, left, finish, compute, workers: int, report: bool) -> list[int]:
    """Runs the batches of `left` (taken from its front) in `pool`, at most `workers` in flight,
    calling `finish` for each; returns the indices of the batches lost when the pool broke
    (empty when every batch finished)."""
    running: dict[cf.Future, int] = {}
    broken: list[int] = []
    while left or running:
        while left and len(running) < workers and not broken:
            i = left.popleft()
            cell, seeds = todo[i]
            sink = _Forward(i) if report else None
            try:
                with _deaf_to_ctrl_c():  # the worker this submit may start inherits the mask
                    future = pool.submit(attempt, compute, cell.config.to_dict(), seeds, sink)
                running[future] = i
            except BrokenProcessPool:  # broken under a batch in flight: seen below
                left.appendleft(i)
                break
        if not running:
            break
        done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
        for fut in sorted(done, key=running.get):
            i = running.pop(fut)
            try:
                results, error = fut.result()
            except BrokenProcessPool:
                broken.append(i)
                continue
            finish(i, results, error)
    return sorted(broken)
