"""The quantizer's entry points: fake_quant, quantize_dequantize, quantize and QTensor.

    import fp4lab as fl
    spec = fl.nvfp4()           # E2M1, 1x16 tiles, E4M3 block scale, FP32 tensor scale
    q = fl.quantize(x, spec)    # QTensor: codes (uint8), block scales, outer scale
    x_hat = q.dequantize()      # same shape and dtype as x
    y = fl.fake_quant(x, spec)  # = quantize(x, spec).dequantize(), straight-through grad

Blocks run along `spec.axis` (default -1, the contraction axis). 2D tiles (ty, tx) also block
the axis before it (after moving `axis` last), as weight tiles of 16x16 do.

This module checks the arguments (outside jit, where a given amax is still concrete), keys the
trace by the quantizer that runs (`kernel_route.enabled()`) and hands the input to
`fp4lab.core.blocks`, which takes it to the blocks, through the kernel or the reference scale
rules, and back (docs/architecture.md, "The quantizer's route").

The blocks API, for the statistics of `fp4lab.core.stats`: `quantize_blocks` (the prepared
input and its scaled grid values in the moved layout's blocked view), `quantize_view` (the
same in the cheapest view), `kernel_blocks` (the kernel's x_hat blocks), `dequantized_view`,
`restore` and `restore_view` (back to the input's layout), and the dequantization of
`fp4lab.core.dequant` (`grid_values`, `dequantize_blocks`, `dequantize_terms`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fp4lab.core import blocks, formats, hadamard, kernel_route, subnormal
from fp4lab.core.blocks import restore, restore_view
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
    x_hat, transform_key = _quantize_dequantize(
        jax.lax.stop_gradient(x), spec, key, transform_key, amax, rotated, kernel
    )
    if rotated and spec.transform is not None:  # straight through the rotation itself
        axis = spec.axis % x.ndim
        xr = hadamard.rotate(jnp.moveaxis(x, axis, -1), spec.transform, transform_key)
        x = jnp.moveaxis(xr, -1, axis).astype(x.dtype)
    return _ste(x, x_hat)


@jax.custom_jvp
def _ste(x, x_hat):
    return x_hat


@_ste.defjvp
def _ste_jvp(primals, tangents):
    x, x_hat = primals
    dx, _ = tangents
    return x_hat, dx


def quantize_dequantize(x, spec, *, key=None, transform_key=None, amax=None, rotated=False):
    """x_hat of `quantize` in one call (no straight-through gradient; see `fake_quant`).

    The same values as `quantize(...).dequantize(rotated=rotated)`, computed from the element
    grid values without encoding them to codes and decoding them back, and, along an axis
    that is not last, without moving it (`blocks.in_place_view`). On the CPU backend the
    block-scaled rules run as one kernel call (`fp4lab.core.kernel_route`), with the same bits.

    Jitted per (shape, dtype, spec, rotated): inside a larger program, operands of the same
    shape and spec (a block's q, k and v projections) share one trace and one lowering, and
    an eager call compiles once. XLA inlines the call into the surrounding program; that the
    values stay bit for bit those of the quantizer written out in it is what the bit-exactness
    tests and the committed runs' reproductions check, not something XLA promises.
    """
    _check_spec(spec)
    _check_amax(amax)  # a concrete amax, before jit turns it into a tracer
    kernel = kernel_route.enabled()
    return _quantize_dequantize(x, spec, key, transform_key, amax, rotated, kernel)[0]


@functools.partial(jax.jit, static_argnames=("spec", "rotated", "kernel"))
def _quantize_dequantize(x, spec, key, transform_key, amax, rotated, kernel):
    """(x_hat, transform key): `blocks.dequantized`, jitted per (shape, dtype, spec, rotated,
    kernel)."""
    return blocks.dequantized(x, spec, key, transform_key, amax, rotated, bool(kernel))


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
        codes = blocks.unblock(scaled.q).astype(fmt.dtype)  # exact: already rounded
    else:
        codes = formats.encode(blocks.unblock(scaled.q), fmt)
    outer = outer_scale(scaled, scope)
    return QTensor(codes, scaled.scale, outer, transform_key, spec, x.shape, x.dtype)


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
    vals = blocks.block_view(q.values(), blocks.tile(q.spec, q.codes.shape))
    fmt = formats.get_format(q.spec.elem)
    vals, scale, outer = subnormal.dequantize_factors(vals, q.scale, q.outer, fmt)
    x = blocks.unblock(vals * scale * outer)
    return restore(x, q.spec, q.shape, q.dtype, q.transform_key, rotated)


def quantize_blocks(x, spec: QuantSpec, key, transform_key, amax):
    """The quantizer without codes: (xb, scaled, scope amax, transform key); args as `quantize`.

    xb: the prepared (moved, padded, rotated) float32 input in its blocked view; scaled: the
    element grid values and scales of `scaling.scale_blocks`; pass-through casts give the cast
    values with unit scales. `quantize` encodes the grid values; the telemetry uses them
    directly.
    """
    _check_spec(spec)
    _check_amax(amax)
    return blocks.reference_blocks(x, spec, key, transform_key, amax, in_place=False)[:4]


def quantize_view(x, spec: QuantSpec, key, transform_key, amax):
    """`quantize_blocks` in the cheapest blocked view: (xb, scaled, scope, transform key, view).

    Along an inner axis that can be blocked where it lies (`blocks.in_place_view`), xb is the
    in-place view (P, L/tx, tx, Q/ty, ty) and `view` its sizes; otherwise xb is the moved layout's
    (..., R/ty, ty, K/tx, tx) and `view` is None. Either way the block axes are the third and
    the first from the end, and the values are the same bit for bit (`tests/core/test_in_place`).
    `restore_view` takes a blocked x_hat back to x's layout.
    """
    _check_spec(spec)
    _check_amax(amax)
    return blocks.reference_blocks(x, spec, key, transform_key, amax, in_place=True)


def kernel_blocks(x, spec: QuantSpec, key, transform_key, amax, measure: bool = False):
    """x_hat's blocks from the CPU kernel (where `kernel_route.supports(spec, key, amax)`):
    (xhat_b, transform key, in-place view sizes or None), as `quantize_view` blocks them; with
    `measure` also the rotated blocked input and the saturated fraction (`blocks.kernel_blocks`).
    """
    _check_spec(spec)
    return blocks.kernel_blocks(x, spec, key, transform_key, amax, measure)


def dequantized_view(x, spec: QuantSpec, key, transform_key, amax, rotated: bool):
    """(x_hat, xb, scaled, scope): x_hat as the reference quantizer of `quantize_dequantize`
    computes it, and the blocked view it came from (`quantize_view`'s xb, scaled and scope
    amax: x_hat's blocks are `dequantize_blocks(scaled, ..., scope)`), for a caller that
    measures the quantization too (`fp4lab.core.stats`). Not jitted itself."""
    _check_spec(spec)
    _check_amax(amax)
    return blocks.dequantized_view(x, spec, key, transform_key, amax, rotated)[:4]


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
