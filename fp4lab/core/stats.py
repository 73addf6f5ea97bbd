"""Quantization statistics of one operand, measured in the domain its GEMM sees.

    rel_err     ||x_hat - x|| / ||x||                      (0 for an all-zero operand)
    bias        mean(x_hat - x) / mean|x|                  signed; RNE on E2M1 shrinks (< 0)
    flush       #(x != 0 and x_hat == 0) / #(x != 0)       elements flushed to zero
    saturated   #(clipped to the largest code of their block) / #elements
    underflow   #(blocks with nonzero input and all-zero output) / #blocks
    map4        #(blocks that chose map-to-4) / #blocks    four-over-six only (else 0)

in the order of `fp4lab.schema.STATS`, after any Hadamard rotation. The quantizer's own blocks
(`fp4lab.core.quantize.quantize_blocks`) are measured, so x_hat is bit for bit what
`quantize(...).dequantize(rotated=True)` gives.

Two comparisons of a tensor with a reference, for the drift telemetry:

    relative_drift(a, ref)   ||a - ref|| / ||ref||   (0 when a == ref, +inf when only ref is 0)
    cosine(a, b)             <a, b> / (||a|| ||b||)  (1 when both are 0, 0 when one is)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fp4lab.core import formats, scaling
from fp4lab.core.quantize import dequantize_blocks, grid_values, quantize_blocks, restore
from fp4lab.core.spec import QuantSpec

__all__ = ["operand_stats", "relative_drift", "cosine"]


@functools.partial(jax.jit, static_argnames="spec")
def operand_stats(a: jax.Array, spec: QuantSpec, *, key=None, transform_key=None, amax=None):
    """Quantizes `a` under `spec` and measures the error.

    Args:
      a, spec, key, transform_key, amax: as `fp4lab.quantize`.
    Returns:
      (x_hat, stats): x_hat as `quantize(...).dequantize(rotated=True)` gives it, and a float32
      vector with the entries of `fp4lab.schema.STATS`.
    """
    a = jnp.asarray(a)
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
    x_hat = restore(scaling.unblock(xhat_b), spec, a.shape, a.dtype, transform_key, rotated=True)
    return x_hat, stats


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
