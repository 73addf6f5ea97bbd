"""Dequantization: x_hat from the parts a quantization leaves (`scaling.Scaled`: element grid
values, block scales and the outer scale), as IEEE float32 products in a fixed order.

`fp4lab.core.quantize` quantizes and re-exports these; the fused statistics (`fp4lab.core.stats`)
take the same factors to recompute x_hat in their kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp4lab.core import formats, scaling, subnormal

__all__ = ["grid_values", "dequantize_blocks", "dequantize_terms", "outer_scale"]


def grid_values(q: jax.Array, fmt: formats.ElementFormat) -> jax.Array:
    """decode(encode(q)) for element grid values q, computed without the codes.

    Grid values round-trip exactly, except where a format has no code for them: NaN becomes 0
    in formats without a NaN code (the NaN lives in the block scale), and integers have no -0.
    """
    if fmt.kind == "int":
        return jnp.where(jnp.isnan(q) | (q == 0), jnp.float32(0.0), q)
    if fmt.kind == "float":
        if fmt.has_nan:  # saturated q holds no infinities
            return q
        return jnp.where(jnp.isnan(q), jnp.float32(0.0), q)
    if fmt.kind == "cast":
        return q
    return formats.decode(formats.encode(q, fmt), fmt)


def dequantize_blocks(scaled: scaling.Scaled, fmt: formats.ElementFormat, scope) -> jax.Array:
    """x_hat in the blocked view: grid values * block scale * outer, as `QTensor.dequantize`,
    rounded as IEEE float32 also where a scale is a subnormal XLA's CPU code reads as 0
    (`subnormal.dequantize_factors`); an x_hat below 2**-126 it writes as 0 of its sign.

    Float grid values go in as they are: where q is NaN (a NaN input), a scale is NaN too
    (every rule in `scaling` puts it there), so x_hat is NaN as the codes would have it.
    Integer grids go through `grid_values`, which also turns -0 into 0.
    """
    vals, outer = dequantize_terms(scaled, fmt, scope)
    vals, scale, outer = subnormal.dequantize_factors(vals, scaled.scale, outer, fmt)
    return vals * scale * outer


def dequantize_terms(scaled: scaling.Scaled, fmt: formats.ElementFormat, scope):
    """(grid values, outer scale) of `dequantize_blocks`: x_hat = (vals * scaled.scale) * outer,
    two IEEE float32 products in that order (as the fused statistics' kernel computes them,
    from `subnormal.dequantize_factors`); the outer scale broadcast to the scope amax's shape."""
    vals = scaled.q if fmt.kind == "float" else grid_values(scaled.q, fmt)
    return vals, outer_scale(scaled, scope)


def outer_scale(scaled: scaling.Scaled, scope) -> jax.Array:
    """The outer scale, broadcast to the scope amax's shape (one per row or one per tensor)."""
    return jnp.broadcast_to(scaled.outer, scope.shape) if scope is not None else scaled.outer
