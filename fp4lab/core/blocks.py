"""How a spec becomes blocks, and blocks become x_hat again: the quantizer below its entry points.

`fp4lab.core.quantize` checks the arguments and hands the input here; `dequantized` is the
whole route of `quantize_dequantize` and `fake_quant`, read top-down:

    keys           the rounding key and the Hadamard's key from the caller's key (`keys`)
    view           the blocked view: where the quantized axis is inner and nothing needs padding,
                   the in-place view (P, L/tx, tx, Q/ty, ty) of x where it lies (`in_place_view`),
                   else x with the axis moved last, zero-padded, viewed (..., R/ty, ty, K/tx, tx)
                   (`prepare`, `block_view`); rotated (`hadamard.rotate`) unless the kernel rotates
    quantize       the blocks' x_hat: one call of the CPU kernel where `fp4lab.core.kernel_route`
                   takes the spec (`kernel_blocks`), else the jnp reference: the scale rules of
                   `fp4lab.core.scaling` (`reference_blocks`), then `fp4lab.core.dequant`
    restore        x_hat back in x's layout: unrotated (unless `rotated`), unpadded, the axis
                   moved back (`restore_view`)

Both views give the same values bit for bit: the in-place view's blocks, block amaxes and
elements are the moved layout's, transposed, and everything the quantizer computes from them is
elementwise or a max, given the random bits of each element's position in the moved layout
(`stream_index`; `tests/core/test_in_place.py`). The in-place view is taken only where no
padding is needed, the scope is not "row" and four-over-six (whose sums run in the moved
layout's order) is off.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fp4lab.core import dequant, formats, hadamard, kernel_route, prng, scaling
from fp4lab.core.spec import QuantSpec

__all__ = [
    "dequantized",
    "dequantized_view",
    "kernel_blocks",
    "reference_blocks",
    "keys",
    "in_place_view",
    "stream_index",
    "tile",
    "prepare",
    "block_view",
    "unblock",
    "restore",
    "restore_view",
]


def dequantized(x, spec: QuantSpec, key, transform_key, amax, rotated: bool, kernel: bool):
    """(x_hat, transform key): x_hat of `quantize_dequantize` in x's shape and dtype, from the
    CPU kernel where `kernel` and `kernel_route.supports` the spec, else from the reference;
    the transform key is the one given, or the one drawn from `key` (None without either)."""
    x = jnp.asarray(x)
    if kernel and kernel_route.supports(spec, key, amax) and x.size < 2**32:
        xhat_b, transform_key, view = kernel_blocks(x, spec, key, transform_key, amax)
        x_hat = restore_view(xhat_b, spec, x.shape, x.dtype, transform_key, rotated, view)
    else:
        x_hat, *_, transform_key = dequantized_view(x, spec, key, transform_key, amax, rotated)
    return x_hat, transform_key


def dequantized_view(x, spec: QuantSpec, key, transform_key, amax, rotated: bool):
    """The reference's x_hat, and the blocked view it came from: (x_hat, xb, scaled, scope
    amax, transform key), x_hat's blocks being `dequant.dequantize_blocks(scaled, ..., scope)`."""
    x = jnp.asarray(x)
    xb, scaled, scope, transform_key, view = reference_blocks(
        x, spec, key, transform_key, amax, in_place=True
    )
    xhat_b = dequant.dequantize_blocks(scaled, formats.get_format(spec.elem), scope)
    x_hat = restore_view(xhat_b, spec, x.shape, x.dtype, transform_key, rotated, view)
    return x_hat, xb, scaled, scope, transform_key


def kernel_blocks(x, spec: QuantSpec, key, transform_key, amax, measure: bool = False):
    """x_hat's blocks from the CPU kernel (where `kernel_route.supports(spec, key, amax)`), the
    Hadamard in the kernel where `kernel_route.rotates`: (xhat_b, transform key, in-place view
    sizes or None), blocked as `reference_blocks(..., in_place=True)` blocks them; with
    `measure` also the rotated blocked input and the saturated fraction, for the statistics
    (`fp4lab.core.stats`)."""
    turn = kernel_route.rotates(spec, in_place_view(x.shape, spec))  # in the kernel
    xb, k_round, transform_key, view, _ = _blocked(x, spec, key, transform_key, True, not turn)
    out = kernel_route.dequantized_blocks(
        xb,
        spec,
        k_round,
        amax,
        in_place=view is not None,
        rotate=turn,
        transform_key=transform_key,
        count=measure,
        keep_rotated=measure and turn,
    )
    if not measure:
        return out, transform_key, view
    xhat_b, saturated, *rotated = out
    return xhat_b, transform_key, view, rotated[0] if turn else xb, saturated


def reference_blocks(x, spec: QuantSpec, key, transform_key, amax, *, in_place: bool):
    """The reference quantizer without codes: (xb, scaled, scope amax, transform key, in-place
    view sizes or None).

    xb: the prepared (moved, padded, rotated) float32 input in its blocked view, the in-place
    one where `in_place` and `in_place_view` allow it (then `view` holds its sizes); scaled:
    the element grid values and scales of `scaling.scale_blocks` (pass-through casts: the cast
    values with unit scales, and no scope).
    """
    xb, k_round, transform_key, view, index = _blocked(x, spec, key, transform_key, in_place)
    scaled, scope = scaling.scale_blocks(xb, spec, k_round, amax, index)
    return xb, scaled, scope, transform_key, view


def keys(key, spec: QuantSpec, transform_key=None):
    """(rounding key, transform key) from `key` (both None without it): a random-sign Hadamard
    needs randomness only for its signs, so a given transform key is enough for it; stochastic
    rounding always needs `key`."""
    needs = spec.rounding == "stochastic" or (spec.needs_key and transform_key is None)
    if needs and key is None:
        raise ValueError(
            f"this QuantSpec needs a PRNG key (rounding={spec.rounding!r}, "
            f"transform={spec.transform!r}); pass key=..."
        )
    if key is None:
        return None, None
    k_round, k_transform = prng.split(key)
    return k_round, k_transform


def _blocked(x, spec: QuantSpec, key, transform_key, in_place: bool, rotate: bool = True):
    """The quantizer's input, checked, prepared and rotated (unless not `rotate`: in-place
    views only), in its blocked view: (xb, rounding key, transform key, in-place view sizes or
    None, stream index or None)."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"quantize needs a floating-point array, got {x.dtype}")
    if x.size == 0:
        raise ValueError(f"quantize got an empty array of shape {tuple(x.shape)}: nothing to scale")
    k_round, k_t = keys(key, spec, transform_key)
    if transform_key is None:
        transform_key = k_t
    view = in_place_view(x.shape, spec) if in_place else None
    index = None
    if view is None:
        xt = prepare(x, spec)
        if spec.transform is not None:
            xt = hadamard.rotate(xt, spec.transform, transform_key)
        xb = block_view(xt, tile(spec, xt.shape))
    else:
        p, n, q, ty, tx = view
        xi = x.astype(jnp.float32).reshape(p, n, q)
        if spec.transform is not None and rotate:
            xi = hadamard.rotate(xi, spec.transform, transform_key, axis=1)
        xb = xi.reshape(p, n // tx, tx, q // ty, ty)
        if spec.rounding == "stochastic":
            index = stream_index(xb.shape, n, q)
    return xb, k_round, transform_key, view, index


def in_place_view(shape: tuple, spec: QuantSpec):
    """(P, L, Q, ty, tx) when x can be blocked where it lies, else None.

    Blocking along an axis that is not last needs no transposes: x viewed as (P, L, Q) (the
    axes before, the quantized axis, the axes after) blocks as (P, L/tx, tx, Q/ty, ty), whose
    blocks, block amaxes and elements are those of the moved layout's (P, Q/ty, ty, L/tx, tx),
    transposed (see the module docstring for where it is taken).
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


def tile(spec: QuantSpec, shape: tuple) -> tuple[int, int]:
    """The (ty, tx) blocks of `spec` over a moved layout of `shape`: the whole row without a
    tile."""
    return spec.tile if spec.tile is not None else (1, shape[-1])


def _padded(n: int, t: int) -> int:
    return -(-n // t) * t


def prepare(x: jax.Array, spec: QuantSpec):
    """Validates shape vs tile, moves the axis last, views as (..., R, K) and zero-pads."""
    ndim = x.ndim
    if ndim == 0:
        raise ValueError("quantize needs an array with at least one axis, got a scalar")
    axis = spec.axis if spec.axis >= 0 else ndim + spec.axis
    if not 0 <= axis < ndim:
        raise ValueError(f"QuantSpec.axis={spec.axis} is out of range for shape {x.shape}")
    xt = jnp.moveaxis(x.astype(jnp.float32), axis, -1)
    if xt.ndim == 1:
        xt = xt[None, :]
    ty, tx = spec.tile or (1, 1)
    k, r = xt.shape[-1], xt.shape[-2]
    if spec.transform is not None and not spec.pad and k % spec.transform.size:
        raise ValueError(
            f"Hadamard size {spec.transform.size} does not divide axis {axis} of "
            f"shape {tuple(x.shape)}"
        )
    need_k = tx if spec.transform is None else math.lcm(tx, spec.transform.size)
    if (k % need_k or r % ty) and not spec.pad:
        raise ValueError(
            f"tile {spec.tile} does not divide shape {tuple(x.shape)} along axis "
            f"{axis} (and the axis before it for 2D tiles); pass pad=True to "
            "zero-pad"
        )
    pk, pr = _padded(k, need_k) - k, _padded(r, ty) - r
    if pk or pr:
        widths = [(0, 0)] * (xt.ndim - 2) + [(0, pr), (0, pk)]
        xt = jnp.pad(xt, widths)
    return xt


def block_view(x: jax.Array, tile: tuple[int, int]) -> jax.Array:
    """(..., R, K) -> (..., R/ty, ty, K/tx, tx); shapes must already divide."""
    ty, tx = tile
    *lead, r, k = x.shape
    return x.reshape(*lead, r // ty, ty, k // tx, tx)


def unblock(xb: jax.Array) -> jax.Array:
    """Inverse of `block_view`."""
    *lead, rb, ty, kb, tx = xb.shape
    return xb.reshape(*lead, rb * ty, kb * tx)


def restore_view(xhat_b, spec: QuantSpec, shape, dtype, transform_key, rotated, view):
    """x_hat of a blocked view (the in-place one where `view` holds its sizes, else the moved
    layout's) back in `shape` and `dtype`, as `restore`."""
    if view is None:
        return restore(unblock(xhat_b), spec, shape, dtype, transform_key, rotated)
    p, n, q, _, _ = view
    x = xhat_b.reshape(p, n, q)
    if spec.transform is not None and not rotated:
        x = hadamard.unrotate(x, spec.transform, transform_key, axis=1)
    return x.reshape(shape).astype(dtype)


def restore(xt, spec, shape, dtype, transform_key, rotated):
    """The inverse of `prepare`: (..., R, K) values back to `shape` and `dtype`.

    Unrotates (unless `rotated`), drops the zero padding and moves `spec.axis` back. Args as
    the QTensor fields of the same names; `xt` is `unblock` of a blocked view.
    """
    ndim = len(shape)
    axis = spec.axis if spec.axis >= 0 else ndim + spec.axis
    moved = list(shape)
    moved.append(moved.pop(axis))
    if spec.transform is not None:
        if not rotated:
            xt = hadamard.unrotate(xt, spec.transform, transform_key)
        elif moved[-1] % spec.transform.size:
            # Padding inside a Hadamard block: the rotation mixes the zeros into the kept
            # entries, and cutting the rotated axis back would silently change dot products.
            raise ValueError(
                f"rotated=True with a padded axis {axis} of shape {tuple(shape)} (padded to "
                f"{xt.shape[-1]} for Hadamard size {spec.transform.size}): the rotated values "
                "only contract correctly at the padded length; use rotated=False"
            )
    if ndim == 1:
        xt = xt[0]
    xt = xt[tuple(slice(0, n) for n in moved)]
    return jnp.moveaxis(xt, -1, axis).astype(dtype)
