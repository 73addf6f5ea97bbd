"""The in-place blocked view: quantizing along an axis that is not last without moving it.

`fp4lab.core.quantize.quantize_view` blocks x where it lies when `in_place_view` allows it; the
values are those of the moved layout bit for bit (`tests/core/test_in_place.py`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fp4lab.core import hadamard
from fp4lab.core.spec import QuantSpec

__all__ = ["in_place_view", "stream_index", "restore_in_place"]


def in_place_view(shape: tuple, spec: QuantSpec):
    """(P, L, Q, ty, tx) when x can be blocked where it lies, else None.

    Blocking along an axis that is not last needs no transposes: x viewed as (P, L, Q) (the
    axes before, the quantized axis, the axes after) blocks as (P, L/tx, tx, Q/ty, ty), whose
    blocks, block amaxes and elements are those of the moved layout's (P, Q/ty, ty, L/tx, tx),
    transposed. Everything the quantizer computes from them is elementwise or a max, so the
    values are the same bit for bit, given the random bits of each element's position in the
    moved layout (`stream_index`). Taken only where no padding is needed, the scope is not
    "row" and four-over-six (whose sums run in the moved layout's order) is off.
    """
    ndim = len(shape)
    axis = spec.axis if spec.axis >= 0 else ndim + spec.axis
    if ndim < 2 or not 0 <= axis < ndim - 1:
        return None
    if spec.outer == "row" or spec.four_over_six is not None:
        return None
    p, n, q = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    ty, tx = spec.tile or (1, n)
    need = tx if spec.transform is None else math.lcm(tx, spec.transform.size)
    if n % need or shape[-1] % ty:
        return None
    return p, n, q, ty, tx


def stream_index(shape: tuple, n: int, q: int) -> jax.Array:
    """Each element's flat position in the moved layout (P, Q, L), for the in-place blocked
    view of `shape` (P, L/tx, tx, Q/ty, ty): the positions its random bits are drawn at."""
    _, _, tx, _, ty = shape

    def iota(d):
        return jax.lax.broadcasted_iota(jnp.uint32, shape, d)

    rows = iota(0) * jnp.uint32(q) + iota(3) * jnp.uint32(ty) + iota(4)
    return rows * jnp.uint32(n) + iota(1) * jnp.uint32(tx) + iota(2)


def restore_in_place(xb, spec, shape, dtype, transform_key, rotated, view):
    """`restore` for the in-place blocked view: unrotated along the quantized axis (unless
    `rotated`) and reshaped back; no transposes."""
    p, n, q, _, _ = view
    x = xb.reshape(p, n, q)
    if spec.transform is not None and not rotated:
        x = hadamard.unrotate(x, spec.transform, transform_key, axis=1)
    return x.reshape(shape).astype(dtype)
