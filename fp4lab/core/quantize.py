"""quantize / dequantize / fake_quant, QTensor, and the blocks API the telemetry shares.

    import fp4lab as fl
    spec = fl.nvfp4()           # E2M1, 1x16 tiles, E4M3 block scale, FP32 tensor scale
    q = fl.quantize(x, spec)    # QTensor: codes (uint8), block scales, outer scale
    x_hat = q.dequantize()      # same shape and dtype as x
    y = fl.fake_quant(x, spec)  # = quantize(x, spec).dequantize(), straight-through grad

Blocks run along `spec.axis` (default -1, the contraction axis). 2D tiles (ty, tx) also block
the axis before it (after moving `axis` last), as weight tiles of 16x16 do.

The blocks API is what `quantize`, `quantize_dequantize` and the statistics of
`fp4lab.core.stats` are built from: `quantize_blocks` (the prepared input and its scaled grid
values in the blocked view), `grid_values`, `dequantize_blocks` (and its two factors,
`dequantize_terms`) and `restore` (back to the input's layout); `quantize_view` and
`restore_view` are the same with the blocks taken where they lie along an inner axis (no
transposes), as `quantize_dequantize` and the fused statistics take them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fp4lab.core import formats, hadamard, kernel_route, layout, prng, scaling, subnormal
from fp4lab.core.dequant import dequantize_blocks, dequantize_terms, grid_values, outer_scale
from fp4lab.core.spec import QuantSpec

__all__ = [
    "QTensor",
    "quantize",
    "quantize_dequantize",
    "fake_quant",
    "quantize_blocks",
    "quantize_view",
    "kernel_blocks",
    "restore_view",
    "dequantized_view",
    "dequantize_blocks",
    "dequantize_terms",
    "grid_values",
    "restore",
]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QTensor:
    """A quantized tensor.

    codes: uint8 element codes (pass-through casts: the cast values), laid out with `spec.axis`
        moved last and zero padding kept, shape (..., R, K).
    scale: float32 block scales, shape (..., R/ty, 1, K/tx, 1): values exactly representable in
        the block-scale format (NaN for a scope computed from non-finite input).
    outer: float32 outer dequantization factor, broadcastable against the blocks.
    x_hat = decode(codes) * scale * outer (as `dequantize_blocks`), unpadded, unrotated, moved.
    """

    codes: jax.Array
    scale: jax.Array
    outer: jax.Array
    transform_key: jax.Array | None
    spec: QuantSpec = dataclasses.field(metadata=dict(static=True))
    shape: tuple = dataclasses.field(metadata=dict(static=True))
    dtype: Any = dataclasses.field(metadata=dict(static=True))

    def values(self) -> jax.Array:
        """Element grid values (float32), same layout as `codes`."""
        fmt = formats.get_format(self.spec.elem)
        if fmt.kind == "cast":
            return self.codes.astype(jnp.float32)
        return formats.decode(self.codes, fmt)

    def dequantize(self, *, rotated: bool = False) -> jax.Array:
        """x_hat in x's shape and dtype. rotated=True keeps the Hadamard domain (for GEMMs).
        Jitted per spec, shape and rotated: an eager call compiles once."""
        return _dequantize(self, rotated)


@functools.partial(jax.jit, static_argnames=("rotated",))
def _dequantize(q: QTensor, rotated: bool) -> jax.Array:
    vals = scaling.block_view(q.values(), _tile(q.spec, q.codes.shape))
    fmt = formats.get_format(q.spec.elem)
    vals, scale, outer = subnormal.dequantize_factors(vals, q.scale, q.outer, fmt)
    x = scaling.unblock(vals * scale * outer)
    return restore(x, q.spec, q.shape, q.dtype, q.transform_key, rotated)


def _tile(spec: QuantSpec, shape: tuple) -> tuple[int, int]:
    return spec.tile if spec.tile is not None else (1, shape[-1])


def _padded(n: int, t: int) -> int:
    return -(-n // t) * t


def _prepare(x: jax.Array, spec: QuantSpec):
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


def restore(xt, spec, shape, dtype, transform_key, rotated):
    """The inverse of the preparation: (..., R, K) values back to `shape` and `dtype`.

    Unrotates (unless `rotated`), drops the zero padding and moves `spec.axis` back. Args as
    the QTensor fields of the same names; `xt` is `scaling.unblock` of a blocked view.
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


def _split(key, spec: QuantSpec, transform_key=None):
    # A random-sign Hadamard needs randomness only for its signs: a given transform key is
    # enough for it; stochastic rounding always needs `key`.
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


def quantize(
    x: jax.Array,
    spec: QuantSpec,
    *,
    key: jax.Array | None = None,
    transform_key: jax.Array | None = None,
    amax: jax.Array | None = None,
) -> QTensor:
    """Quantizes x under `spec`.

    Args:
      x: float32, bfloat16 or float16 array.
      spec: the QuantSpec.
      key: PRNG key; required for stochastic rounding, and for random-sign Hadamards unless
        `transform_key` is given.
      transform_key: key for random Hadamard signs (default: derived from `key`). Two GEMM
        operands rotated with the same transform key cancel exactly.
      amax: optional amax of the outer scope (delayed scaling): one value, or for a "row"
        scope one per row; default: computed from x (current scaling).
    Returns:
      A QTensor; `.dequantize()` gives x_hat.
    Jitted per spec, shape and dtype: an eager call compiles once (inside a larger program it
    is inlined).
    """
    _check_spec(spec)
    _check_amax(amax)  # a concrete amax, before jit turns it into a tracer
    return _quantize(jnp.asarray(x), spec, key, transform_key, amax)


@functools.partial(jax.jit, static_argnames=("spec",))
def _quantize(x, spec, key, transform_key, amax) -> QTensor:
    xb, scaled, scope, transform_key = quantize_blocks(x, spec, key, transform_key, amax)
    fmt = formats.get_format(spec.elem)
    if fmt.kind == "cast":
        codes = scaling.unblock(scaled.q).astype(fmt.dtype)  # exact: already rounded
    else:
        codes = formats.encode(scaling.unblock(scaled.q), fmt)
    outer = outer_scale(scaled, scope)
    return QTensor(codes, scaled.scale, outer, transform_key, spec, x.shape, x.dtype)


def quantize_blocks(x, spec: QuantSpec, key, transform_key, amax):
    """The quantizer without codes: (xb, scaled, scope amax, transform key); args as `quantize`.

    xb: the prepared (moved, padded, rotated) float32 input in its blocked view; scaled: the
    element grid values and scales of `scaling`; pass-through casts give the cast values with
    unit scales. `quantize` encodes the grid values; `quantize_dequantize` and the telemetry
    use them directly.
    """
    return _quantize_blocks(x, spec, key, transform_key, amax, in_place=False)[:4]


def quantize_view(x, spec: QuantSpec, key, transform_key, amax):
    """`quantize_blocks` in the cheapest blocked view: (xb, scaled, scope, transform key, view).

    Along an inner axis that can be blocked where it lies (`layout.in_place_view`), xb is the
    in-place view (P, L/tx, tx, Q/ty, ty) and `view` its sizes; otherwise xb is the moved layout's
    (..., R/ty, ty, K/tx, tx) and `view` is None. Either way the block axes are the third and
    the first from the end, and the values are the same bit for bit (`tests/core/test_in_place`).
    `restore_view` takes a blocked x_hat back to x's layout.
    """
    return _quantize_blocks(x, spec, key, transform_key, amax, in_place=True)


def restore_view(xhat_b, spec: QuantSpec, shape, dtype, transform_key, rotated, view):
    """x_hat of `quantize_view`'s blocked view back in `shape` and `dtype` (as `restore`)."""
    if view is not None:
        return layout.restore_in_place(xhat_b, spec, shape, dtype, transform_key, rotated, view)
    return restore(scaling.unblock(xhat_b), spec, shape, dtype, transform_key, rotated)


def kernel_blocks(x, spec: QuantSpec, key, transform_key, amax, measure: bool = False):
    """x_hat's blocks from the CPU kernel (where `kernel_route.supports(spec, key, amax)`), the
    Hadamard in the kernel where `kernel_route.rotates`: (xhat_b, transform key, in-place view sizes
    or None), as `quantize_view` blocks them; with `measure` also the rotated blocked input
    and the saturated fraction, for the statistics (`fp4lab.core.stats`)."""
    turn = kernel_route.rotates(spec, layout.in_place_view(x.shape, spec))  # in the kernel
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


def _blocked(x, spec: QuantSpec, key, transform_key, in_place: bool, rotate: bool = True):
    """The quantizer's input, checked, prepared and rotated (unless not `rotate`: in-place
    views only), in its blocked view: (xb, rounding key, transform key, in-place view sizes or
    None, stream index or None)."""
    _check_spec(spec)
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"quantize needs a floating-point array, got {x.dtype}")
    if x.size == 0:
        raise ValueError(f"quantize got an empty array of shape {tuple(x.shape)}: nothing to scale")
    k_round, k_t = _split(key, spec, transform_key)
    if transform_key is None:
        transform_key = k_t
    view = layout.in_place_view(x.shape, spec) if in_place else None
    index = None
    if view is None:
        xt = _prepare(x, spec)
        if spec.transform is not None:
            xt = hadamard.rotate(xt, spec.transform, transform_key)
        xb = scaling.block_view(xt, _tile(spec, xt.shape))
    else:
        p, n, q, ty, tx = view
        xi = x.astype(jnp.float32).reshape(p, n, q)
        if spec.transform is not None and rotate:
            xi = hadamard.rotate(xi, spec.transform, transform_key, axis=1)
        xb = xi.reshape(p, n // tx, tx, q // ty, ty)
        if spec.rounding == "stochastic":
            index = layout.stream_index(xb.shape, n, q)
    return xb, k_round, transform_key, view, index


def _quantize_blocks(x, spec: QuantSpec, key, transform_key, amax, *, in_place: bool):
    """`quantize_blocks`, and the in-place view's sizes (`layout.in_place_view`) when
    `in_place` allows it (then xb is the in-place blocked view; `layout.restore_in_place`
    undoes it), else None."""
    _check_spec(spec)
    _check_amax(amax)
    xb, k_round, transform_key, view, index = _blocked(x, spec, key, transform_key, in_place)
    fmt = formats.get_format(spec.elem)
    if fmt.kind == "cast":
        one = jnp.ones((1,) * xb.ndim, jnp.float32)
        q = formats.cast_round(xb, fmt)
        return xb, scaling.Scaled(q, one, jnp.float32(1.0)), None, transform_key, view
    amax_b = scaling.block_amax(xb) if spec.block_scale is not None else None
    if amax is None or spec.outer == "none":
        scope = scaling.scope_amax(xb, spec.outer, amax_b)
    else:
        scope = _scope_from(amax, xb, spec.outer)
    scaled = _scale(xb, scope, spec, fmt, k_round, amax_b, index)
    return xb, scaled, scope, transform_key, view


def _check_spec(spec) -> None:
    if not isinstance(spec, QuantSpec):
        raise ValueError(f"quantize needs a QuantSpec, got {type(spec).__name__}")


def _check_amax(amax) -> None:
    """A given (concrete) amax must be finite and > 0: a scale computed from 0, a negative or a
    non-finite amax is meaningless. Traced values (under jit) are not checked here."""
    if amax is None or isinstance(amax, jax.core.Tracer):
        return
    a = np.asarray(amax, np.float64)
    if a.size == 0 or not np.all(np.isfinite(a) & (a > 0)):
        shown = a.item() if a.size == 1 else f"array of shape {a.shape}"
        raise ValueError(
            f"amax={shown}; allowed: finite values > 0 (the amax of the outer scale's scope), "
            "or None for current scaling"
        )


def _scope_from(amax, xb, outer):
    """A given scope amax in the shape of `scaling.scope_amax`: one value, or one per row ("row").

    One value serves every row; otherwise there must be exactly one value per row, in the
    rows' order (x with the quantized axis moved last and the others flattened).
    """
    a = jnp.asarray(amax, jnp.float32)
    shape = (1,) * xb.ndim if outer == "tensor" else (*xb.shape[:-2], 1, 1)
    if a.size == 1:
        return jnp.broadcast_to(a.reshape(()), shape)
    if a.size != math.prod(shape):
        raise ValueError(
            f"amax has {a.size} values; the {outer!r} scope of this input takes 1"
            + (f" or {math.prod(shape)} (one per row)" if outer == "row" else "")
        )
    return a.reshape(shape)


def _scale(xb, scope, spec: QuantSpec, fmt, key, amax_b, index=None) -> scaling.Scaled:
    rnd = dict(rounding=spec.rounding, key=key, index=index)
    if spec.block_scale == "e4m3":
        if spec.convention == "te":
            return scaling.nvfp4_te(
                xb, scope, elem=fmt, four_over_six=spec.four_over_six, amax_b=amax_b, **rnd
            )
        return scaling.nvfp4_jax(xb, scope, elem=fmt, **rnd)
    if spec.block_scale == "e8m0":
        return scaling.mx(xb, elem=fmt, scale_rounding=spec.scale_rounding, amax_b=amax_b, **rnd)
    if spec.block_scale == "fp32":
        return scaling.fp32_blocks(xb, elem=fmt, amax_b=amax_b, **rnd)
    return scaling.per_scope(xb, scope, elem=fmt, **rnd)


def quantize_dequantize(x, spec, *, key=None, transform_key=None, amax=None, rotated=False):
    """x_hat of `quantize` in one call (no straight-through gradient; see `fake_quant`).

    The same values as `quantize(...).dequantize(rotated=rotated)`, computed from the element
    grid values without encoding them to codes and decoding them back, and, along an axis
    that is not last, without moving it (`layout.in_place_view`). On the CPU backend the
    block-scaled rules run as one kernel call (`fp4lab.core.kernel_route`), with the same bits.

    Jitted per (shape, dtype, spec, rotated): inside a larger program, operands of the same
    shape and spec (a block's q, k and v projections) share one trace and one lowering, and
    an eager call compiles once. XLA inlines the call into the surrounding program; that the
    values stay bit for bit those of the quantizer written out in it is what the bit-exactness
    tests and the committed runs' reproductions check, not something XLA promises.
    """
    _check_spec(spec)
    _check_amax(amax)  # a concrete amax, before jit turns it into a tracer
    return _quantize_dequantize(x, spec, key, transform_key, amax, rotated, kernel_route.enabled())


@functools.partial(jax.jit, static_argnames=("spec", "rotated", "kernel"))
def _quantize_dequantize(x, spec, key, transform_key, amax, rotated, kernel):
    x = jnp.asarray(x)
    if kernel and kernel_route.supports(spec, key, amax) and x.size < 2**32:
        xhat_b, transform_key, view = kernel_blocks(x, spec, key, transform_key, amax)
        return restore_view(xhat_b, spec, x.shape, x.dtype, transform_key, rotated, view)
    return dequantized_view(x, spec, key, transform_key, amax, rotated)[0]


def dequantized_view(x, spec: QuantSpec, key, transform_key, amax, rotated: bool):
    """(x_hat, xb, scaled, scope): x_hat as `quantize_dequantize` computes it, and the blocked
    view it came from (`quantize_view`'s xb, scaled and scope amax: x_hat's blocks are
    `dequantize_blocks(scaled, ..., scope)`), for a caller that measures the quantization too
    (`fp4lab.core.stats`). Not jitted itself."""
    x = jnp.asarray(x)
    xb, scaled, scope, transform_key, view = quantize_view(x, spec, key, transform_key, amax)
    xhat_b = dequantize_blocks(scaled, formats.get_format(spec.elem), scope)
    x_hat = restore_view(xhat_b, spec, x.shape, x.dtype, transform_key, rotated, view)
    return x_hat, xb, scaled, scope


@jax.custom_jvp
def _ste(x, x_hat):
    return x_hat


@_ste.defjvp
def _ste_jvp(primals, tangents):
    x, x_hat = primals
    dx, _ = tangents
    return x_hat, dx


def fake_quant(
    x: jax.Array,
    spec: QuantSpec | None,
    *,
    key: jax.Array | None = None,
    transform_key: jax.Array | None = None,
    amax: jax.Array | None = None,
    rotated: bool = False,
) -> jax.Array:
    """Quantize-dequantize x: same shape and dtype as x.

    Gradient: straight-through (the identity), the standard estimator for quantization-aware
    training: d fake_quant(x) / dx = I, including for saturated elements. `spec=None` returns x.
    rotated=True returns the values in the Hadamard domain (both GEMM operands rotated).
    Jitted per spec, shape and dtype: an eager call compiles once.
    """
    if spec is None:
        return x
    _check_spec(spec)
    _check_amax(amax)  # a concrete amax, before jit turns it into a tracer
    return _fake_quant(x, spec, key, transform_key, amax, rotated, kernel_route.enabled())


@functools.partial(jax.jit, static_argnames=("spec", "rotated", "kernel"))
def _fake_quant(x, spec, key, transform_key, amax, rotated, kernel):
    del kernel  # keys the trace: quantize_dequantize inside reads `kernel_route.enabled()` itself
    if transform_key is None:
        transform_key = _split(key, spec)[1]
    else:
        _split(key, spec, transform_key)  # stochastic rounding still needs `key`
    x_hat = quantize_dequantize(
        jax.lax.stop_gradient(x),
        spec,
        key=key,
        transform_key=transform_key,
        amax=amax,
        rotated=rotated,
    )
    if rotated and spec.transform is not None:  # straight through the rotation itself
        axis = spec.axis % x.ndim
        xr = hadamard.rotate(jnp.moveaxis(x, axis, -1), spec.transform, transform_key)
        x = jnp.moveaxis(xr, -1, axis).astype(x.dtype)
    return _ste(x, x_hat)
