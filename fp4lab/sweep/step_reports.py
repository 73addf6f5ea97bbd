"""Step reports out of a compiled training run, through a queue in the CPU kernels' library.

    report_step(done, run, values)   inside a compiled program: queues one step report
    take_reports()                   on the host, from any thread: the reports queued since

The queue is step_reports.cc, beside this module, built into the one library of fp4lab's CPU
kernels (`fp4lab.core.kernel_build`, which `fp4lab.core.cpu_kernels` loads and registers). A
program that reports through it stays an ordinary XLA program, which jax's caches and
jax.export keep, as they do not keep one with a Python callback (`fp4lab.sweep.compute`).
"""

from __future__ import annotations

import ctypes
import functools

import jax
import jax.numpy as jnp
import numpy as np

from fp4lab.core import cpu_kernels

__all__ = ["TARGET", "report_step", "take_reports"]

TARGET = "fp4lab_progress"  # the FFI target of step_reports.cc (one of `cpu_kernels.TARGETS`)


def report_step(done: jax.Array, run: jax.Array, values: jax.Array) -> None:
    """Queues one step report from inside a compiled program (`take_reports` drains it).

    Args:
      done: int32 (), the steps done.
      run: uint32 (R,), the run's stream key data (it tells the seeds of a vmapped call apart).
      values: float32 (V,), the step's outputs to report.
    Marked as a side effect, so XLA neither removes nor merges it; it reads its operands and
    writes nothing the program reads, so a program's results are those without it, bit for bit.
    Vmapped calls queue one report per batch member.
    Raises:
      RuntimeError: the kernels cannot be built here (`cpu_kernels.build_error`).
    """
    if not cpu_kernels.available():
        raise RuntimeError(f"fp4lab's CPU kernels are not available: {cpu_kernels.build_error()}")
    call = jax.ffi.ffi_call(
        TARGET,
        jax.ShapeDtypeStruct((), jnp.int32),
        vmap_method="broadcast_all",
        has_side_effect=True,
    )
    call(
        jnp.asarray(done, jnp.int32),
        jnp.asarray(run, jnp.uint32),
        jnp.asarray(values, jnp.float32),
    )


@functools.cache
def _queue() -> ctypes.CDLL | None:
    """The kernels' library as this process loaded it (the same handle: a library is loaded
    once per process), or None without the kernels."""
    lib = cpu_kernels.library()
    return None if lib is None else ctypes.CDLL(str(lib))


def take_reports() -> list[tuple[int, tuple[int, ...], np.ndarray]]:
    """The step reports queued since the last call, oldest first: (done, run words, values).
    Safe to call from any thread while a program runs; [] without the kernels."""
    handle = _queue()
    if handle is None:
        return []
    shape = np.zeros(3, np.int64)
    handle.fp4lab_progress_pending(shape.ctypes.data_as(ctypes.c_void_p))
    n, r, v = (int(x) for x in shape)
    if n == 0:
        return []
    done = np.zeros(n, np.int32)
    run = np.zeros((n, r), np.uint32)
    values = np.zeros((n, v), np.float32)
    take = handle.fp4lab_progress_take
    take.restype = ctypes.c_int64
    args = (a.ctypes.data_as(ctypes.c_void_p) for a in (done, run, values))
    got = take(ctypes.c_int64(n), *args)
    return [(int(done[i]), tuple(int(w) for w in run[i]), values[i]) for i in range(got)]
