"""CPU kernels of the numerics: C++ built at install (or on first use), called through XLA's FFI.

    quantize.cc        x_hat of the block-scaled quantizers in one call
                       (`fp4lab.core.kernel_route` says when it runs): a few kernels' worth
                       of program instead of a dozen fusions, specialized to their shape,
                       per operand for XLA to compile
    operand_stats.cc   the telemetry's statistics of one quantized operand in one pass over
                       x and the grid values, x_hat computed on the way from the block and
                       outer scales (`fp4lab.core.stats`, method "fused")
    threefry.cc        the Threefry-2x32 hash of jax's fold_in and split (`fp4lab.core.prng`):
                       one instruction of the program where jax compiles a while loop at
                       every key the quantizers derive; and jax's own hash, elementwise,
                       where `lower_jax_threefry` is turned on
    ../sweep/step_reports.cc
                       step reports out of a compiled training run into a queue the host
                       drains (`fp4lab.sweep.step_reports`): unlike a Python callback it
                       leaves the program one that jax's caches and jax.export keep

XLA's CPU backend gives every reduction its own pass over its operand, with a full-size
temporary in front of each; six statistics of every GEMM operand then cost more than the
training step itself. The kernel reads each element once, in the quantizer's blocked view.

Build (`fp4lab.core.kernel_build`): `pip install` builds the sources into
`fp4lab/core/_kernels*.so` (setup.py), stamped with the jaxlib version, its FFI API version and
the sources' digest; a process loads it where the sources are the same and its jaxlib's FFI
API is compatible, and runs no compiler. Otherwise (no library from the install, a source
edited in an editable checkout) the first process that needs a kernel compiles the sources
with the C++ compiler (`$CXX`, else the first of c++, g++, clang++ on the PATH) against the
FFI headers of the installed jaxlib into one `kernels-<hash>.so` in `cache_folder()`
($FP4LAB_KERNEL_CACHE, else <$XDG_CACHE_HOME or ~/.cache>/fp4lab/kernels). A build that fails
(at install or on first use) leaves a record keyed like the library, so no later process
tries again; each says the reason in one line on stderr, and fp4lab runs its jnp reference.
The source needs C++17 with GCC's vector extensions (GCC 12 or newer, or Clang) on x86-64 or
aarch64. The flags leave no room for the compiler to reorder float arithmetic
(-ffp-contract=off, no fast-math), so a kernel's sums are the same IEEE operations in the same
order on any CPU; -fno-trapping-math lets the quantizer's loops vectorize in every clone.
The quantizer's element loops exist once per instruction set (`CLONES`: x86-64 AVX-512F, AVX2
and the SSE2 baseline; elsewhere one copy, NEON on aarch64); a call runs the widest this CPU
has, or the one FP4LAB_CPU_CLONE names (`clone()`): every clone gives the same bits.
`available()` says whether the kernels could be built here, `build_error()` why not and
`library()` which library was loaded;
`compile_command()` is the command itself (the tests build each CPU's copy of the statistics'
loop with it, to check that they all give the same bits).
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import random as jex_random
from jax.interpreters import mlir

from fp4lab.core import kernel_build

__all__ = [
    "SOURCE",
    "TARGETS",
    "CLONES",
    "available",
    "clones",
    "clone",
    "build_error",
    "library",
    "block_stats",
    "quantize_blocks",
    "threefry",
    "threefry2x32",
    "lower_jax_threefry",
    "cache_folder",
    "compile_command",
]

SOURCE = Path(__file__).with_name("operand_stats.cc")  # the statistics kernel's C++ source
SOURCES = tuple(kernel_build.PACKAGE / path for path in kernel_build.SOURCES)  # one library
_TARGET = "fp4lab_operand_stats"
_THREEFRY = "fp4lab_threefry"
_THREEFRY2X32 = "fp4lab_threefry2x32"
_PROGRESS = "fp4lab_progress"
_QUANTIZE = "fp4lab_quantize"
TARGETS = (
    _TARGET,
    _QUANTIZE,
    _THREEFRY,
    _THREEFRY2X32,
    _PROGRESS,
)  # the FFI targets the kernels register (what a program may call)
CLONES = ("baseline", "avx2", "avx512f")  # the quantizer's element loops, per instruction set
cache_folder = kernel_build.cache_folder
compile_command = kernel_build.compile_command


@functools.cache
def _build() -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, "") or (None, why it is not available); once per process, which
    says why in one line on stderr (`kernel_build.find`: the library built at install when it
    fits, else the one built on first use, never a second try after a recorded failure)."""
    lib, why = kernel_build.find()
    if lib is not None:
        try:
            handle = ctypes.CDLL(str(lib))
            for target in TARGETS:
                capsule = jax.ffi.pycapsule(getattr(handle, target))
                jax.ffi.register_ffi_target(target, capsule, platform="cpu")
            handle.fp4lab_quantize_clones.restype = ctypes.c_int64
        except (OSError, AttributeError) as e:
            handle, why = None, f"cannot load {lib}: {e}"
        else:
            handle.path = lib
            return handle, ""
    if not kernel_build.install_failure_said():  # one line a process
        print(f"fp4lab: no CPU kernels, the jnp reference runs instead: {why}", file=sys.stderr)
    return None, why


def library() -> Path | None:
    """The kernels' library this process loaded (the one built at install, or on first use),
    or None when they are not available."""
    handle = _build()[0]
    return None if handle is None else handle.path


def available() -> bool:
    """Whether the CPU kernels are built (building them now if need be) and registered."""
    return _build()[0] is not None


def build_error() -> str:
    """Why the kernels are not available ("" when they are)."""
    return _build()[1]


def clones() -> tuple[str, ...]:
    """The clones of the quantizer's element loops (`CLONES`) this library holds and this CPU
    runs, narrowest first: x86-64 "baseline" (SSE2), "avx2", "avx512f"; elsewhere "baseline"
    alone (the build's own flags: NEON on aarch64). () without the kernels."""
    handle = _build()[0]
    if handle is None:
        return ()
    bits = handle.fp4lab_quantize_clones()
    return tuple(name for i, name in enumerate(CLONES) if bits >> (i + 1) & 1)


def clone() -> str:
    """The clone the quantizer's kernel runs in calls traced now: $FP4LAB_CPU_CLONE where set
    (one of `clones()`: the tests run each, the benchmarks measure one), else the widest.

    Raises:
      ValueError: FP4LAB_CPU_CLONE names a clone this library or this CPU does not run.
    """
    here = clones()
    forced = os.environ.get("FP4LAB_CPU_CLONE", "")
    if not forced or not here:
        return here[-1] if here else ""
    if forced not in here:
        raise ValueError(
            f"FP4LAB_CPU_CLONE={forced!r}: this library and CPU run {', '.join(here)} "
            f"(of {', '.join(CLONES)})"
        )
    return forced


def block_stats(
    xb: jax.Array, vals_b: jax.Array, scale_b: jax.Array, outer_b: jax.Array, vmax: float
) -> jax.Array:
    """(rel_err, bias, flush, saturated, underflow) of a blocked operand, float32 (5,).

    Args:
      xb, vals_b: float32 arrays of one shape (..., A, t1, B, t2), the quantizer's blocked
        view (`fp4lab.core.quantize.quantize_view`): the prepared input and the element grid
        values; blocks span the axes t1 and t2.
      scale_b: the block scales, broadcastable to (..., A, 1, B, 1).
      outer_b: the outer scales, broadcastable to (..., A, t1, 1, 1) (one per tensor or row).
      vmax: the element format's largest magnitude (a saturated element's |grid value|).
    x_hat is (vals_b * scale_b) * outer_b, computed in the kernel as the quantizer computes it
    (`fp4lab.core.quantize.dequantize_blocks`), so the caller need not write it out.
    Vmapped calls run the kernel once over the stacked batch, each member on its own.
    Raises:
      RuntimeError: the kernels cannot be built here (`build_error`).
    """
    if not available():
        raise RuntimeError(f"fp4lab's CPU kernels are not available: {build_error()}")
    if xb.shape != vals_b.shape or xb.ndim < 4:
        raise ValueError(f"block_stats needs two blocked views of one shape, got {xb.shape}")
    *lead, a, t1, b, t2 = xb.shape
    pa = int(np.prod(lead, dtype=np.int64)) * a
    # one block scale per block, one outer scale per row: a scale that varied within a block
    # (or an outer one along the blocks) does not broadcast, and is an error here
    scale = jnp.broadcast_to(jnp.asarray(scale_b, jnp.float32), (*lead, a, 1, b, 1))
    outer = jnp.broadcast_to(jnp.asarray(outer_b, jnp.float32), (*lead, a, t1, 1, 1))
    call = jax.ffi.ffi_call(
        _TARGET, jax.ShapeDtypeStruct((5,), jnp.float32), vmap_method="broadcast_all"
    )
    args = jax.lax.stop_gradient(
        (
            xb.astype(jnp.float32),
            vals_b.astype(jnp.float32),
            scale.reshape(*lead, a, b),
            outer.reshape(*lead, a, t1),
        )
    )  # statistics are measurements: nothing differentiates through them
    return call(*args, pa=pa, t1=t1, nb=b, t2=t2, vmax=np.float32(vmax))


def quantize_blocks(
    xb: jax.Array,
    key: jax.Array,
    amax: jax.Array,
    rotation: tuple | None = None,
    count: bool = False,
    keep_rotated: bool = False,
    **attrs: int | np.float32,
) -> jax.Array | tuple:
    """x_hat of a blocked operand (quantize.cc; `fp4lab.core.kernel_route` builds the arguments).

    Args:
      xb: float32 (..., A, t1, B, t2), the quantizer's blocked view; blocks span t1 and t2.
      key: uint32 (2,), the stochastic rounding key's words (read when attrs["sr"]).
      amax: float32 (1,), a given tensor amax (read when attrs["given"]).
      rotation: None, or (signs, k, rest): rotate xb first along t1 as `hadamard.rotate` does
        (a Hadamard of size t1; needs t2 = 1): signs float32 (t1,) or None, then 2**-k, the
        butterflies and `rest` (`hadamard.scale_split`); x_hat is then in the rotated domain.
      count: also return the fraction of elements that saturated (float32, one per call:
        grid value +-max and |x| > |x_hat|, `fp4lab.core.stats`' `saturated`).
      keep_rotated: with `rotation`, also return the rotated operand (xb's shape).
      attrs: the kernel's attributes but the view's sizes and the rotation's (rule, scope,
        given, sr, stream, kmin, mbits, emax, vmax, inv_max).
    Vmapped calls run the kernel once over the stacked batch, each member on its own.
    Raises:
      RuntimeError: the kernels cannot be built here (`build_error`).
    """
    if not available():
        raise RuntimeError(f"fp4lab's CPU kernels are not available: {build_error()}")
    *_, a, t1, b, t2 = xb.shape
    # The kernel reads the view from its sizes, so its operand and result travel as the 2-D
    # (rows, b * t2), whose minor axis is the view's last. XLA writes them as bitcasts of
    # the arrays beside the call, and a bitcast that regroups the major axes (the view's 5-D
    # against an operand's (8, 256, 1024)) costs the transposes beside it their tiling
    # (measured: docs/performance.md, "Measurements behind the code").
    rows = (xb.size // (b * t2), b * t2)
    keep = rotation is not None and keep_rotated
    outputs = (
        jax.ShapeDtypeStruct(rows, jnp.float32),
        jax.ShapeDtypeStruct((1,), jnp.float32),
        jax.ShapeDtypeStruct(rows if keep else (1,), jnp.float32),
    )
    call = jax.ffi.ffi_call(_QUANTIZE, outputs, vmap_method="broadcast_all")
    signs, k, rest = rotation if rotation is not None else (None, 0, 1.0)
    if rotation is not None and t2 != 1:
        raise ValueError(f"quantize_blocks rotates along t1 only with t2 = 1, got {xb.shape}")
    signed = signs is not None
    signs = jnp.ones(t1, jnp.float32) if signs is None else jnp.asarray(signs, jnp.float32)
    args = jax.lax.stop_gradient((xb.astype(jnp.float32).reshape(rows), key, amax, signs))
    sizes = dict(pa=a, t1=t1, nb=b, t2=t2, unb=xb.size)
    turn = dict(
        rotate=int(rotation is not None), hk=int(k), sign=int(signed), rest=np.float32(rest)
    )
    # quantize.cc's `Clone`: 1, 2, 3 a forced clone; 0 the widest the CPU that runs the
    # program has (a stored program may run on another CPU than the one that traced it)
    forced = clone() if os.environ.get("FP4LAB_CPU_CLONE") else None
    which = CLONES.index(forced) + 1 if forced else 0
    x_hat, saturated, rotated = call(*args, **sizes, **turn, count=int(count), clone=which, **attrs)
    out = (x_hat.reshape(xb.shape),)
    if count:
        out += (saturated[..., 0],)
    if keep:
        out += (rotated.reshape(xb.shape),)
    return out if len(out) > 1 else out[0]


def threefry(keys: jax.Array, counts: jax.Array) -> jax.Array:
    """The keys threefry2x32(key, (0, c)) for the counters c: uint32 (*S, 2), each the pair
    (y0, y1) (jax's fold_in and split).

    Args:
      keys: uint32 (2,): the key words (k0, k1).
      counts: uint32, any shape S: the low counter words c (a few: one thread hashes them).
    Vmapped calls run the kernel once over the batch (keys, counters or both batched).
    Raises:
      RuntimeError: the kernels cannot be built here (`build_error`).
    """
    if not available():
        raise RuntimeError(f"fp4lab's CPU kernels are not available: {build_error()}")
    if keys.shape != (2,) or keys.dtype != jnp.uint32 or counts.dtype != jnp.uint32:
        raise ValueError(f"threefry needs uint32 keys (2,) and counters, got {keys.shape}")
    call = jax.ffi.ffi_call(
        _THREEFRY, jax.ShapeDtypeStruct((*counts.shape, 2), jnp.uint32), vmap_method="expand_dims"
    )
    return call(keys, counts)


def threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array) -> list[jax.Array]:
    """[y0, y1] = threefry2x32((k0, k1), (x0, x1)) elementwise, on one thread: four uint32
    arrays that broadcast together (the operands of jax's `threefry2x32_p`).

    Raises:
      RuntimeError: the kernels cannot be built here (`build_error`).
    """
    if not available():
        raise RuntimeError(f"fp4lab's CPU kernels are not available: {build_error()}")
    words = [jnp.asarray(w) for w in (k0, k1, x0, x1)]
    if any(w.dtype != jnp.uint32 for w in words):
        raise ValueError(f"threefry2x32 needs uint32 words, got {[str(w.dtype) for w in words]}")
    return _threefry2x32_call(*words)


def _threefry2x32_call(*words: jax.Array) -> list[jax.Array]:
    """threefry2x32's kernel call, unchecked (the kernels are registered)."""
    shape = jnp.broadcast_shapes(*(w.shape for w in words))
    if math.prod(shape) == 0:
        return [jnp.zeros(shape, jnp.uint32)] * 2
    out = jax.ShapeDtypeStruct(shape, jnp.uint32)
    call = jax.ffi.ffi_call(_THREEFRY2X32, (out, out), vmap_method="broadcast_all")
    return list(call(*(jnp.broadcast_to(w, shape) for w in words)))


def lower_jax_threefry() -> bool:
    """From now on in this process, jax's Threefry primitive (`jax.extend.random.threefry2x32_p`,
    behind every jax.random function of a Threefry key: flax's initializers, a model's
    dropout, a task's sampler) lowers on the CPU to `threefry2x32`'s kernel call: one
    instruction where jax compiles a while loop of five iterations, so programs that derive
    or draw many keys compile faster (a small training program: about a quarter less compile
    time). The bits are the same: integer arithmetic (the tests compare it with jax's
    lowering and with published test vectors). The kernel runs on one thread, so a large
    draw may run slower; programs lowered before the call keep jax's loop. Off unless
    called (the test suite turns it on).

    Returns:
      Whether it is on: False where the kernels are not available (jax's lowering stays).
    """
    if not available():
        return False
    rule = mlir.lower_fun(_threefry2x32_call, multiple_results=True)
    mlir.register_lowering(jex_random.threefry2x32_p, rule, platform="cpu")
    return True
