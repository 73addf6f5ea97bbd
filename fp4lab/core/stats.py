"""Quantization statistics of one operand, measured in the domain its GEMM sees.

    rel_err     ||x_hat - x|| / ||x||                      (0 for an all-zero operand)
    bias        mean(x_hat - x) / mean|x|                  signed; RNE on E2M1 shrinks (< 0)
    flush       #(x != 0 and x_hat == 0) / #(x != 0)       elements flushed to zero
    saturated   #(clipped to the largest code of their block) / #elements
    underflow   #(blocks with nonzero input and all-zero output) / #blocks
    map4        #(blocks that chose map-to-4) / #blocks    four-over-six only (else 0)

in the order of `fp4lab.schema.STATS`, after any Hadamard rotation. The quantizer's own blocks
are measured, so x_hat is bit for bit what `quantize(...).dequantize(rotated=True)` gives.

Two methods compute them (`operand_stats(..., method=)`):

    "fused"      the default: one pass over x and the grid values in the quantizer's blocked
                 view (`quantize_view`: an inner axis blocked where it lies), by a C++ kernel
                 on the CPU (`fp4lab.core.cpu_kernels`) that computes x_hat from them and the
                 block and outer scales as the quantizer does (where the quantizer itself
                 runs as its CPU kernel, `fp4lab.core.kernel_route`, from that kernel's x_hat
                 with scales of 1, and its saturated count: the same bits). The float sums run in
                 double precision, so rel_err and bias are the float32 roundings of nearly exact
                 values; both are NaN for an operand holding a NaN or an infinity.
    "reference"  the jnp formulas, float32 sums in the order XLA gives them, in the moved
                 layout: what fp4lab recorded before the fused statistics, and still what runs
                 that ask for it (`Config.telemetry_stats`) record, bit for bit. A NaN in the
                 operand gives rel_err and bias 0 here (an infinity NaN), as it always did.

The counts behind flush, saturated, underflow and map4 are exact under both methods; "fused"
divides them correctly rounded, where the reference's means multiply by a rounded 1/n (so the
fractions may differ in their last bit). The float statistics agree to float32 rounding.
Where the kernel cannot run (another backend, or a CPU without a C++ compiler: a warning says
so once), "fused" computes the reference formulas. `operand_stats_deferred` gives x_hat at once
and the statistics as a function to call later (a training step calls it behind a `lax.cond`
on the steps that log): "fused" then measures the blocks of that one quantization.

Two comparisons of a tensor with a reference, for the drift telemetry:

    relative_drift(a, ref)   ||a - ref|| / ||ref||   (0 when a == ref, +inf when only ref is 0)
    cosine(a, b)             <a, b> / (||a|| ||b||)  (1 when both are 0, 0 when one is)
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp

from fp4lab.core import blocks, cpu_kernels, formats, kernel_route, scaling, subnormal
from fp4lab.core.quantize import (
    dequantize_blocks,
    dequantize_terms,
    dequantized_view,
    grid_values,
    kernel_blocks,
    quantize_blocks,
    quantize_dequantize,
    restore,
    restore_view,
)
from fp4lab.core.spec import QuantSpec

__all__ = [
    "METHODS",
    "check_method",
    "operand_stats",
    "operand_stats_deferred",
    "relative_drift",
    "cosine",
]

METHODS = ("fused", "reference")  # operand_stats(method=...): see the module docstring


def check_method(method: str) -> str:
    """`method` when it names a way to compute the statistics (`METHODS`), else a ValueError."""
    if method not in METHODS:
        raise ValueError(f"statistics method={method!r}; choose one of {METHODS}")
    return method


def operand_stats(
    a: jax.Array, spec: QuantSpec, *, key=None, transform_key=None, amax=None, method="fused"
):
    """Quantizes `a` under `spec` and measures the error.

    Args:
      a, spec, key, transform_key, amax: as `fp4lab.quantize`.
      method: "fused" or "reference" (the module docstring says how they differ).
    Returns:
      (x_hat, stats): x_hat as `quantize(...).dequantize(rotated=True)` gives it, and a float32
      vector with the entries of `fp4lab.schema.STATS`.
    """
    if check_method(method) == "fused" and not _kernel_here():
        method = "reference"
    return _operand_stats(a, spec, key, transform_key, amax, method, kernel_route.enabled())


def operand_stats_deferred(
    a: jax.Array, spec: QuantSpec, *, key=None, transform_key=None, amax=None, method="fused"
):
    """(x_hat, measure): `operand_stats` with the measuring left for later, e.g. behind a
    `lax.cond` that runs it only on the steps that record telemetry.

    x_hat is `quantize_dequantize(..., rotated=True)`'s, bit for bit, and `measure()` gives the
    statistics `operand_stats` gives. With the fused method, `measure` runs only the kernel's
    pass over the blocks this one quantization made (a training step quantizes each operand
    once, measured or not); with the reference method (or where the kernel cannot run) it
    quantizes `a` again in its own layout, as the reference always has.
    """
    if check_method(method) == "fused" and _kernel_here():
        x_hat, parts = _deferred_parts(a, spec, key, transform_key, amax, kernel_route.enabled())
        fmt = formats.get_format(spec.elem)
        return x_hat, functools.partial(_measure_parts, *parts, fmt)
    x_hat = quantize_dequantize(
        a, spec, key=key, transform_key=transform_key, amax=amax, rotated=True
    )

    def measure():
        return _operand_stats(a, spec, key, transform_key, amax, "reference", False)[1]

    return x_hat, measure


@functools.partial(jax.jit, static_argnames=("spec", "kernel"))
def _deferred_parts(a, spec, key, transform_key, amax, kernel):
    """x_hat (`quantize_dequantize`'s, rotated), and what the statistics kernel measures it
    from: the blocked input, the element grid values, the block and outer scales (x_hat's
    blocks are their products, taken as `dequantize_blocks` takes them:
    `subnormal.dequantize_factors`, so that no factor is a subnormal the kernel's flush-to-zero
    arithmetic would read as 0) and four-over-six's choices (None without it).

    Where the quantizer runs as its CPU kernel (`kernel`, `fp4lab.core.kernel_route`), x_hat's
    blocks come from it with the saturated fraction (and the rotated input, where the kernel
    rotates), and stand for the grid values with scales of 1: (x_hat * 1) * 1 is x_hat, so the
    statistics kernel's sums are the same bits."""
    a = jnp.asarray(a)
    if kernel and kernel_route.supports(spec, key, amax) and a.size < 2**32:
        xhat_b, transform_key, view, xb, saturated = kernel_blocks(
            a, spec, key, transform_key, amax, measure=True
        )
        x_hat = restore_view(xhat_b, spec, a.shape, a.dtype, transform_key, True, view)
        one = jnp.ones((), jnp.float32)
        return x_hat, (xb, xhat_b, one, one, None, saturated)
    x_hat, xb, scaled, scope = dequantized_view(a, spec, key, transform_key, amax, True)
    fmt = formats.get_format(spec.elem)
    vals, outer = dequantize_terms(scaled, fmt, scope)
    factors = subnormal.dequantize_factors(vals, scaled.scale, outer, fmt)
    return x_hat, (xb, *factors, scaled.map4, None)


def _measure_parts(xb, vals, scale, outer, map4, saturated, fmt):
    """The fused statistics of one quantization from `_deferred_parts`' parts (as `_fused`).

    The kernel computes x_hat from the grid values and the scales rather than reading it: the
    GEMM's x_hat can then be written straight in the layout the GEMM wants (a transposed copy
    for the Wgrad operands), without a second copy in the blocked view for the kernel."""
    vmax = fmt.max * subnormal.grid_unit(fmt)  # |vals| of a saturated element
    if saturated is not None:  # the quantizer kernel's x_hat and count (`_deferred_parts`)
        five = cpu_kernels.block_stats(xb, vals, scale, outer, float("inf")).at[3].set(saturated)
    else:
        five = cpu_kernels.block_stats(xb, vals, scale, outer, vmax)
    map4 = jnp.float32(0.0) if map4 is None else jnp.mean(map4)
    return jnp.concatenate([five, map4.astype(jnp.float32)[None]])


_warned = []


def _kernel_here() -> bool:
    """Whether the fused kernel runs here: on the CPU backend, once it is built."""
    if jax.default_backend() != "cpu":
        return False
    if cpu_kernels.available():
        return True
    if not _warned:
        _warned.append(True)
        warnings.warn(
            "fp4lab: the fused telemetry statistics fall back to the reference formulas (float "
            "sums in float32, so their last bits differ): no CPU kernels here (said above)",
            RuntimeWarning,
            stacklevel=3,
        )
    return False


@functools.partial(jax.jit, static_argnames=("spec", "method", "kernel"))
def _operand_stats(a, spec, key, transform_key, amax, method, kernel):
    a = jnp.asarray(a)
    if method == "fused":
        return _fused(a, spec, key, transform_key, amax, kernel)
    return _reference(a, spec, key, transform_key, amax)


def _reference(a, spec, key, transform_key, amax):
    xb, scaled, scope, transform_key = quantize_blocks(a, spec, key, transform_key, amax)
    fmt = formats.get_format(spec.elem)
    vals_b = grid_values(scaled.q, fmt)
    xhat_b = dequantize_blocks(scaled, fmt, scope)
    err = xhat_b - xb
    norm_x = jnp.sqrt(jnp.sum(xb * xb))
    rel = jnp.where(norm_x > 0, jnp.sqrt(jnp.sum(err * err)) / jnp.where(norm_x > 0, norm_x, 1), 0)
    mean_abs = jnp.mean(jnp.abs(xb))
    bias = jnp.where(mean_abs > 0, jnp.mean(err) / jnp.where(mean_abs > 0, mean_abs, 1), 0)
    nonzero = xb != 0
    flush = jnp.sum(nonzero & (xhat_b == 0)) / jnp.maximum(jnp.sum(nonzero), 1)
    top = jnp.abs(vals_b) == jnp.float32(fmt.max)
    saturated = jnp.mean(top & (jnp.abs(xb) > jnp.abs(xhat_b)))
    live = scaling.block_amax(xb) > 0
    dead = scaling.block_amax(xhat_b) == 0
    underflow = jnp.mean(live & dead)
    map4 = jnp.float32(0.0) if scaled.map4 is None else jnp.mean(scaled.map4)
    stats = jnp.stack([rel, bias, flush, saturated, underflow, map4]).astype(jnp.float32)
    x_hat = restore(blocks.unblock(xhat_b), spec, a.shape, a.dtype, transform_key, rotated=True)
    return x_hat, stats


def _fused(a, spec, key, transform_key, amax, kernel):
    x_hat, parts = _deferred_parts(a, spec, key, transform_key, amax, kernel)
    return x_hat, _measure_parts(*parts, formats.get_format(spec.elem))


def relative_drift(a: jax.Array, ref: jax.Array) -> jax.Array:
    """||a - ref|| / ||ref|| in float32 over all elements; 0 when a == ref, +inf when ref is all
    zero and a is not."""
    a, ref = a.astype(jnp.float32).ravel(), ref.astype(jnp.float32).ravel()
    n_diff, n_ref = jnp.linalg.norm(a - ref), jnp.linalg.norm(ref)
    safe = jnp.where(n_ref > 0, n_ref, 1.0)
    return jnp.where(n_ref > 0, n_diff / safe, jnp.where(n_diff == 0, 0.0, jnp.inf))


def cosine(a: jax.Array, b: jax.Array) -> jax.Array:
    """<a, b> / (||a|| ||b||) in float32 over all elements; 1 when both are all zero, 0 when one
    is."""
    a, b = a.astype(jnp.float32).ravel(), b.astype(jnp.float32).ravel()
    na, nb = jnp.linalg.norm(a), jnp.linalg.norm(b)
    both = na * nb
    cos = jnp.dot(a, b) / jnp.where(both > 0, both, 1.0)
    return jnp.where(both > 0, cos, jnp.where(na == nb, 1.0, 0.0))
