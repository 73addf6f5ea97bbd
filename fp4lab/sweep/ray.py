"""The `ray` executor: one Ray task per cell; workers compute, the driver writes.

    fp4lab run experiments/quickstart.py --executor ray                       # Ray on this machine
    fp4lab run experiments/quickstart.py --executor ray --address HEAD:6379   # join a cluster

Each cell of a sweep becomes one Ray task running `compute_cell(config_dict, seeds)` (the cell's
seeds batched inside, as in the local executor). A task takes plain data (the resolved config as
a dict, the seed triples) and returns plain data (per-seed summaries, series and telemetry as
numbers and arrays); the driver calls `finish` as each task completes, and `finish` writes the
store. Workers never touch the results folder, so a cluster needs no shared filesystem, only the
same fp4lab (and, for bit-identical numbers, the same jax) on every node.

What can go wrong, and what happens:

- a worker process dies (a segfault, `os._exit`, an out-of-memory kill, a lost node): a system
  failure, so Ray runs the task again, at most `max_retries` times; a cell still failing after
  that is recorded as failed with a message saying how often its worker was lost.
- the cell's code raises (a bad data path, a bug): retrying would raise again, so the task
  catches the exception and returns its traceback; the cell is recorded as failed and the sweep
  goes on.
- Ctrl-C on the driver: the outstanding tasks are cancelled (their workers killed) and waited
  for until each has ended, a Ray instance this call started is shut down, and
  KeyboardInterrupt is re-raised. Finished runs are already on disk; the next `fp4lab run`
  skips them and computes the rest.
- an address where no Ray cluster answers: one line at once (`check_address`), not Ray's minutes
  of retries.
- a `kill -9` of the driver: the Ray processes this call started (a local instance) end within
  a second or so, the agents Ray itself would leave for a minute included
  (`fp4lab.sweep.reaper`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import warnings
from collections.abc import Sequence
from typing import Any

from fp4lab.sweep import reaper
from fp4lab.sweep.executors import Compute, Finish, attempt

__all__ = [
    "RayNotInstalled",
    "RayUnreachable",
    "cancel",
    "check_address",
    "check_options",
    "import_ray",
    "run",
]

INSTALL = "pip install 'fp4lab[ray]'"


class RayNotInstalled(ModuleNotFoundError):
    """The ray executor was asked for, but Ray cannot be imported in this environment."""


class RayUnreachable(ConnectionError):
    """The Ray cluster named by an address cannot be reached (or the address is malformed)."""


def import_ray():
    """Returns the `ray` module; raises RayNotInstalled, with the install command, without it."""
    try:
        import ray
    except ImportError as e:
        raise RayNotInstalled(
            f"the ray executor needs Ray, which is not installed: {INSTALL}"
        ) from e
    return ray


def run(
    todo: Sequence[tuple[Any, list]],
    finish: Finish,
    compute: Compute,
    *,
    address: str | None = None,
    num_cpus: float = 1,
    num_gpus: float = 0,
    max_retries: int = 3,
) -> None:
    """Computes the cells of `todo` as Ray tasks and calls `finish` for each, as it completes.

    Args:
      todo: [(cell, seeds)], the unfinished work of a sweep (`fp4lab.sweep.runner.pending`).
      compute: `compute(config_dict, seeds) -> [dict per seed]`, run in the workers
        (`fp4lab.sweep.compute.compute_cell`); it travels to them by pickle (cloudpickle).
      finish: called on the driver once per cell, in completion order, as
        `finish(index, results, error)` (index: the cell's place in `todo`): results is what
        `compute` returned (one dict per seed) and error None, or results None and error a
        traceback or a message.
      address: the Ray cluster to join (`ray.init(address=...)`, e.g. "HEAD:6379"). None is
        Ray's default: the cluster named by RAY_ADDRESS or started by `ray start` on this
        machine, else a new local instance for this call. This call disconnects at the end, which
        stops only what it started, never someone else's cluster. If this process is already
        connected to Ray, that connection is used and left open.
      num_cpus: CPUs reserved per task, i.e. per cell (fractions allowed).
      num_gpus: GPUs reserved per task: 1 for cells on the native backend. With a fraction
        several tasks share a GPU; set XLA_PYTHON_CLIENT_PREALLOCATE=false on the workers then, or
        the first jax process takes most of the GPU's memory.
      max_retries: how often Ray reruns a task whose worker process died; exceptions raised by
        the cell's code are never retried.

    Raises:
      RayNotInstalled: Ray cannot be imported here.
      RayUnreachable: `address` takes no connection (at once, or within about 40 s when its port
        answers but is not a Ray head).
      KeyboardInterrupt: re-raised after cancelling the outstanding tasks.
    """
    ray = import_ray()
    check_options(address=address, num_cpus=num_cpus, num_gpus=num_gpus, max_retries=max_retries)
    if not todo:
        return
    connected_here = not ray.is_initialized()
    watchdog = None
    if connected_here:
        check_address(address)
        watchdog = reaper.watch()  # what this call starts dies with this process (module doc)
        try:
            with warnings.catch_warnings(), _one_connect_try(address):
                warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)  # fork+exec: safe
                ray.init(address=address)
        except BaseException as e:
            watchdog.close()
            if address is None or not isinstance(e, Exception):
                raise
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise RayUnreachable(f"cannot connect to the Ray cluster at {address}: {why}") from e
    task = ray.remote(attempt).options(
        num_cpus=num_cpus, num_gpus=num_gpus, max_retries=max_retries, retry_exceptions=False
    )
    outstanding: dict[Any, int] = {}  # task -> the index of its batch in the work
    try:
        compute_ref = ray.put(compute)
        for i, (cell, seeds) in enumerate(todo):
            ref = task.remote(compute_ref, cell.config.to_dict(), [tuple(s) for s in seeds])
            outstanding[ref] = i
        while outstanding:
            (ref,), _ = ray.wait(list(outstanding), num_returns=1)
            i = outstanding.pop(ref)
            results, error = _outcome(ray, ref, max_retries)
            finish(i, results, error)
    except BaseException:  # Ctrl-C, or finish failed: stop the work nobody will collect
        with contextlib.suppress(Exception):  # a broken connection must not hide the cause
            cancel(ray, list(outstanding))
        raise
    finally:
        if connected_here:
            try:
                ray.shutdown()
            finally:
                watchdog.close()


def check_options(
    address: str | None = None, num_cpus: float = 1, num_gpus: float = 0, max_retries: int = 3
) -> None:
    """Raises ValueError (one line) for a bad option of `run`, before anything is computed or
    written; an unknown option is a TypeError, as in `run`."""
    if address is not None and not isinstance(address, str):
        raise ValueError(f"address={address!r}; give 'HOST:PORT' or None")
    if num_cpus < 0 or num_gpus < 0:
        raise ValueError(f"num_cpus={num_cpus}, num_gpus={num_gpus}; must be >= 0")
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ValueError(f"max_retries={max_retries!r}; must be an int >= 0")


def check_address(address: str | None, timeout_s: float = 10.0) -> None:
    """Raises RayUnreachable, in one line, when `address` ("HOST:PORT", or "ray://HOST:PORT")
    names a port that does not take a TCP connection within `timeout_s`. Ray itself would
    retry it for minutes. None reads RAY_ADDRESS as Ray does; "auto" and "local" (and no
    address at all) are Ray's own choices and pass."""
    address = os.environ.get("RAY_ADDRESS") if address is None else address
    if not address or address in ("auto", "local"):
        return
    host, _, port = address.split("://")[-1].rpartition(":")
    if not host or not port.isdigit():
        raise RayUnreachable(f"--address {address!r}: give HOST:PORT, e.g. 10.0.0.1:6379")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
        raise RayUnreachable(
            f"cannot reach the Ray cluster at {address}: {why} (is `ray start --head` "
            "running there, and is the port open?)"
        ) from None


@contextlib.contextmanager
def _one_connect_try(address: str | None):
    """A port that answers but is not a Ray head: one try of Ray's connect loop (about 40 s)
    instead of 20, unless RAY_gcs_server_port_wait_time_s is set (Ray reads it there)."""
    name = "RAY_gcs_server_port_wait_time_s"
    if address is None or name in os.environ:
        yield
        return
    os.environ[name] = "1"
    try:
        yield
    finally:
        os.environ.pop(name, None)


def cancel(ray, refs: list, timeout_s: float = 30.0) -> None:
    """Cancels the tasks of `refs` (killing their workers) and waits until each has ended.

    A cancel can be lost: one that reaches a task while Ray is handing it to a worker leaves
    the task running (seen with Ray 2.60 in about one interrupted sweep in four). So
    the tasks still unfinished after a short wait are cancelled again, until every one has
    ended or `timeout_s` has passed; then a warning says how many may still be running.
    """
    pending = refs
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for ref in pending:
            ray.cancel(ref, force=True)
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
    if pending:
        warnings.warn(
            f"{len(pending)} cancelled Ray task(s) had not ended after {timeout_s:g} s;"
            " they may still be running on the cluster",
            RuntimeWarning,
            stacklevel=3,
        )


def _outcome(ray, ref, max_retries: int) -> tuple[list | None, str | None]:
    """(results, error) of a completed task, turning Ray's failures into an error message."""
    E = ray.exceptions
    lost = (E.WorkerCrashedError, E.NodeDiedError, E.LocalRayletDiedError, E.OutOfMemoryError)
    try:
        return ray.get(ref)
    except E.RayError as e:
        if isinstance(e, lost):  # Ray retried it max_retries times
            tries = f"{max_retries + 1} tries ({max_retries=})"
            why = f"the worker computing this cell died on each of its {tries}"
        elif isinstance(e, E.RayTaskError):  # raised outside the cell's code, e.g. unpickling it
            why = "the Ray task of this cell raised"
        else:
            why = "Ray could not run the task of this cell"
        return None, f"{why}: {type(e).__name__}: {e}"
