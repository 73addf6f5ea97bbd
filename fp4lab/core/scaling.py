"""Scale rules: scopes, tiles, block-scale formats and four-over-six.

`scale_blocks` is the entry: it picks the rule a QuantSpec names and the scope amax (computed,
or the one given), and applies the rule; the rules follow it in this file, and call down only,
into `formats` (the element and scale grids) and `subnormal` (the steps below 2**-126).

All functions work on a *blocked view* of a float32 array whose contraction axis is last:
`xb` has shape (..., R/ty, ty, K/tx, tx) for tiles of ty x tx (ty = 1 for 1D tiles). Block
amaxes have shape (..., R/ty, 1, K/tx, 1); scope amaxes broadcast against them.

Every rule returns a `Scaled`: element grid values `q`, block scales `scale` (float32 values
exactly representable in the block-scale format) and an outer dequantization factor `outer`,
so that x_hat = (q * scale) * outer. The rules that round elements take `rounding`, `key` and
`index` (each element's position in the random stream, for a blocked view laid out otherwise
than the stream: see `formats.round_to_format`).

The rules, exactly as docs/architecture.md §2 and the cited references write them:

NVFP4, convention "te" (TransformerEngine reference_nvfp4.py; NVIDIA 2025, arXiv 2509.25149):
    E = 448 (256 with four-over-six)
    S_enc = min(E*6 / amax_scope, FLT_MAX); if S_enc == 0: S_enc = 1;  S_dec = 1 / S_enc
    s_b = e4m3(clamp(min(amax_b * (S_enc * (1/6)), FLT_MAX), +-448))
    e_b = min(1 / (f32(s_b) * S_dec), FLT_MAX)
    q   = e2m1(clamp(x * e_b, +-6));   x_hat = q * f32(s_b) * S_dec
NVFP4, convention "jax" (jax._src.cudnn.scaled_matmul_stablehlo.quantize):
    x' = x / g,  s_b = e4m3(clip(amax_b(x') / 6, 0, 448)),  q = e2m1(clip(x' / f32(s_b), +-6))
    with g = amax_scope / (6 * 448) (1 where that is 0).
MX (OCP Microscaling v1.0): shared = floor(log2(amax_b)) - emax_elem ("floor"), or
    ceil(log2(amax_b / max_elem)) ("ceil", the RCEIL rule of cuBLAS/TE/jax.nn), clamped to
    [-127, 127] (and to at most 127 - emax_elem, so that max_elem * 2**shared is finite) and
    read from the float bits;  q = elem(clamp(x / 2**shared, +-max)).
Four-over-six (Cook et al. 2025, arXiv 2512.02010): per block a second candidate with the
    block scale x 1.5 (block max -> 4); keep the candidate with the lower block error, MAE or
    MSE, summed as TransformerEngine sums it; ties keep map-to-6.

Non-finite input: a scale computed from a NaN/inf amax is NaN, so every element of its scope
dequantizes to NaN; quantization never turns a NaN into a finite number.

Tiny input: the steps that can fall below float32's normal range (E8M0's 2**-127, 1 / S_enc
and FP8's 1 / scale for scales above 2**126, s_b * S_dec, g and amax_b / max_elem) are computed
as IEEE float32 computes them (`subnormal`), also where the backend flushes subnormals (XLA on CPU);
there an input below 2**-126 reads as 0, and the "jax" g is 1 for a scope amax below 2**-126.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4lab.core import formats, subnormal

__all__ = [
    "Scaled",
    "scale_blocks",
    "scope_amax",
    "block_amax",
    "nvfp4_te",
    "nvfp4_jax",
    "mx",
    "fp32_blocks",
    "per_scope",
]

FLT_MAX = np.float32(np.finfo(np.float32).max)
E4M3_MAX = np.float32(448.0)


class Scaled(NamedTuple):
    q: jax.Array  # element grid values, blocked shape, float32
    scale: jax.Array  # block scales, (..., R/ty, 1, K/tx, 1), float32
    outer: jax.Array  # outer dequantization factor, broadcastable, float32
    map4: jax.Array | None = None  # four-over-six: True where a block chose map-to-4


def scale_blocks(xb: jax.Array, spec, key, amax, index=None) -> tuple[Scaled, jax.Array | None]:
    """(scaled, scope amax): the rule `spec` selects, applied to the blocked view xb.

    Args:
      xb: the prepared float32 input in its blocked view.
      spec: the QuantSpec (its elem, block_scale, convention, outer, rounding, four_over_six,
        scale_rounding).
      key: the rounding key, for stochastic rounding.
      amax: a given amax of the outer scope (delayed scaling; `_scope_from` reads it), or None
        for the amax of xb (current scaling).
      index: each element's position in the random stream, for a view laid out otherwise.
    Pass-through casts (bf16, fp16, fp32) round each element and scale nothing (scope None).
    """
    fmt = formats.get_format(spec.elem)
    if fmt.kind == "cast":
        one = jnp.ones((1,) * xb.ndim, jnp.float32)
        q = formats.cast_round(xb, fmt)
        return Scaled(q, one, jnp.float32(1.0)), None
    amax_b = block_amax(xb) if spec.block_scale is not None else None
    if amax is None or spec.outer == "none":
        scope = scope_amax(xb, spec.outer, amax_b)
    else:
        scope = _scope_from(amax, xb, spec.outer)
    rnd = dict(rounding=spec.rounding, key=key, index=index)
    if spec.block_scale == "e4m3":
        if spec.convention == "te":
            scaled = nvfp4_te(
                xb, scope, elem=fmt, four_over_six=spec.four_over_six, amax_b=amax_b, **rnd
            )
        else:
            scaled = nvfp4_jax(xb, scope, elem=fmt, **rnd)
    elif spec.block_scale == "e8m0":
        scaled = mx(xb, elem=fmt, scale_rounding=spec.scale_rounding, amax_b=amax_b, **rnd)
    elif spec.block_scale == "fp32":
        scaled = fp32_blocks(xb, elem=fmt, amax_b=amax_b, **rnd)
    else:
        scaled = per_scope(xb, scope, elem=fmt, **rnd)
    return scaled, scope


def _scope_from(amax, xb, outer):
    """A given scope amax in the shape of `scope_amax`: one value, or one per row ("row").

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


_ABS_BITS = np.uint32(0x7FFFFFFF)  # every bit but the sign
_INF_BITS = np.uint32(0x7F800000)  # +inf


def _amax(xb: jax.Array, axes: tuple[int, ...] | None = None) -> jax.Array:
    """max |x| over `axes` (all when None), keepdims, with NaN read as +inf.

    Reduced over the float bits: with the sign bit cleared, the bits of non-negative floats
    order as their values, and every NaN's bits lie above +inf's, so an integer max is the
    float amax exactly, and clamping it to +inf's bits reads a NaN as +inf. +inf survives
    every later max, and a non-finite amax makes its scope NaN (`_nan_where_nonfinite`).

    The bits, not a float max of |x|: XLA's CPU backend routes a large float max reduction to
    a library kernel that wants its input in memory (|x| written out, then read once per
    reduction, and the tensor amax read again from it), and that kernel may skip NaN. An
    integer max it fuses with the abs into one pass over x, which is what makes the fake
    quantizer memory-bound (`benchmarks/quantizer.py`).
    """
    axes = tuple(range(xb.ndim)) if axes is None else axes
    bits = lax.bitwise_and(lax.bitcast_convert_type(xb, jnp.uint32), _ABS_BITS)
    top = lax.min(lax.reduce_max(bits, axes), _INF_BITS)
    return lax.expand_dims(lax.bitcast_convert_type(top, jnp.float32), axes)


def block_amax(xb: jax.Array) -> jax.Array:
    """The amax of each block of the blocked view, (..., R/ty, 1, K/tx, 1); NaN reads +inf."""
    return _amax(xb, (xb.ndim - 3, xb.ndim - 1))


def scope_amax(xb: jax.Array, outer: str, amax_b: jax.Array | None = None) -> jax.Array | None:
    """amax over the outer scope: "tensor" (all elements), "row" (each row), "none" -> None.

    Given the block amaxes `amax_b` of xb (`block_amax`), reduces those instead of xb: the
    same value (a max is exact), from a 16x (or 32x) smaller array.
    """
    if outer not in ("tensor", "row"):
        return None
    if amax_b is None:
        if outer == "tensor":
            return _amax(xb)
        return _amax(xb, (xb.ndim - 2, xb.ndim - 1))  # rows: (R/ty, ty) with ty == 1
    if outer == "tensor":
        return jnp.max(amax_b, keepdims=True)
    return jnp.max(amax_b, axis=-2, keepdims=True)  # (..., R, 1, K/tx, 1) -> (..., R, 1, 1, 1)


def _nan_where_nonfinite(scale: jax.Array, amax: jax.Array) -> jax.Array:
    return jnp.where(jnp.isfinite(amax), scale, jnp.nan)


def _div(a: jax.Array, b: jax.Array) -> jax.Array:
    """IEEE a / b, elementwise with broadcasting.

    XLA's algebraic simplifier rewrites a / broadcast(b) into a * broadcast(1 / b), which is off
    by one ulp for about a third of the inputs. The rules that are held bit for bit against
    references dividing for real (TE's quantizer divides in PyTorch) broadcast the divisor
    behind an optimization barrier, where the rewrite cannot see it.
    """
    shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b))
    b = jax.lax.optimization_barrier(jnp.broadcast_to(jnp.asarray(b, jnp.float32), shape))
    return jnp.broadcast_to(a, shape) / b


def _elements(v: jax.Array, fmt: formats.ElementFormat, rounding: str, key, index=None):
    """Element grid values of v, clamped to +-max_elem (round_to_format saturates there);
    `index`: the elements' positions in the random stream (`formats.round_to_format`)."""
    return formats.round_to_format(v, fmt, rounding=rounding, key=key, index=index)


def _e4m3(v: jax.Array, amax_b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """E4M3 block scales of v >= 0, RNE after clamping to 448 (ml_dtypes' cast would overflow
    to NaN): (s_b, s_b with NaN where the block amax is non-finite), `formats.round_scale`."""
    return formats.round_scale(v, "e4m3", lax.is_finite(amax_b))


def _te_global(amax_scope: jax.Array | None, emax: float):
    """S_enc and S_dec of the TE convention; (1, 1) without an outer scope."""
    if amax_scope is None:
        one = jnp.float32(1.0)
        return one, one
    s_enc = jnp.minimum(jnp.float32(emax * 6.0) / amax_scope, FLT_MAX)
    s_enc = jnp.where(s_enc == 0, jnp.float32(1.0), s_enc)
    return s_enc, subnormal.reciprocal(s_enc)  # 1 / S_enc, a subnormal for S_enc > 2**126


def _te_encode(s_b: jax.Array, s_dec: jax.Array) -> jax.Array:
    """e_b = min(1 / (s_b * S_dec), FLT_MAX), with s_b * S_dec rounded as IEEE float32 rounds
    it also below the normal range (`subnormal.product_up`, for S_dec < 2**-60: the same values
    where the plain product is normal)."""
    plain = jnp.minimum(jnp.float32(1.0) / (s_b * s_dec), FLT_MAX)
    lifted = (jnp.float32(1.0) / subnormal.product_up(s_b, s_dec)) * jnp.float32(
        2.0**subnormal.SHIFT
    )
    return jnp.where(s_dec < jnp.float32(2.0**-60), jnp.minimum(lifted, FLT_MAX), plain)


def nvfp4_te(
    xb: jax.Array,
    amax_scope: jax.Array | None,
    *,
    elem: formats.ElementFormat,
    rounding: str = "rne",
    key: jax.Array | None = None,
    four_over_six: str | None = None,
    amax_b: jax.Array | None = None,
    index=None,
) -> Scaled:
    """Two-level E4M3 block scaling, TransformerEngine convention (see module docstring).

    amax_b: the block amaxes of xb (`block_amax`), when the caller has them already.
    """
    amax_b = block_amax(xb) if amax_b is None else amax_b
    six = jnp.float32(elem.max)
    if four_over_six is not None:
        return _four_over_six_te(xb, amax_b, amax_scope, elem, four_over_six)
    s_enc, s_dec = _te_global(amax_scope, 448.0)
    s_b, scale = _e4m3(jnp.minimum(amax_b * (s_enc * (jnp.float32(1.0) / six)), FLT_MAX), amax_b)
    e_b = _te_encode(s_b, s_dec)
    q = _elements(xb * e_b, elem, rounding, key, index)
    return Scaled(q, scale, _outer(s_dec, amax_scope))


def _outer(s_dec: jax.Array, amax_scope: jax.Array | None) -> jax.Array:
    if amax_scope is None:
        return jnp.float32(1.0)
    return _nan_where_nonfinite(s_dec, amax_scope)


def _four_over_six_te(xb, amax_b, amax_scope, elem, mode) -> Scaled:
    """Four-over-six as TransformerEngine's reference quantizer computes it.

    Candidates: s6 = e4m3(amax_b / 6 * S_enc), s4 = e4m3(amax_b / 6 * S_enc * 1.5). Each block's
    error is computed in the input domain, val = q * s * amax_scope / (6 * 256), summed over the
    16 elements of a row in order and, for 16x16 tiles, over the 16 rows in TE's tree order.
    The candidate with the strictly lower error wins; ties keep map-to-6.
    """
    if mode not in ("mae", "mse"):
        raise ValueError(f"four_over_six={mode!r}; allowed: 'mae', 'mse', None")
    emax = 256.0
    s_enc, s_dec = _te_global(amax_scope, emax)
    six = jnp.float32(elem.max)
    base = _div(amax_b, six) * s_enc

    # both candidates at once, on a leading axis: map-to-4 (1.5), map-to-6 (1.0); the same
    # elementwise operations as one candidate at a time, in half the program
    def lead(a):
        return a[None] if jnp.ndim(a) else a

    mult = jnp.array([1.5, 1.0], jnp.float32).reshape((2,) + (1,) * base.ndim)
    s = _e4m3(lead(base) * mult, jnp.broadcast_to(amax_b, (2, *amax_b.shape)))[0]
    e = _te_encode(s, lead(s_dec))
    q = _elements(lead(xb) * e, elem, "rne", None)
    val = q * s  # back in the input domain: q * s * amax_scope / (6 * E), as TE writes it
    if amax_scope is not None:
        val = _div(val * lead(amax_scope), jnp.float32(6.0 * emax))
    diff = val - lead(xb)
    d = diff * diff if mode == "mse" else jnp.abs(diff)
    err = d[..., 0:1]
    for i in range(1, xb.shape[-1]):  # sequential, as the reference sums it
        err = err + d[..., i : i + 1]
    err = _tree_sum_rows(err)
    pick4 = err[0] < err[1]
    q = jnp.where(pick4, q[0], q[1])
    s = jnp.where(pick4, s[0], s[1])
    return Scaled(q, _nan_where_nonfinite(s, amax_b), _outer(s_dec, amax_scope), pick4)


def _tree_sum_rows(err: jax.Array) -> jax.Array:
    """Sums (..., ty, Kb, 1) row errors over ty by halving, as TE's warp reduction does."""
    while err.shape[-3] > 1:
        h = err.shape[-3] // 2
        err = err[..., :h, :, :] + err[..., h:, :, :]
    return err


def nvfp4_jax(
    xb: jax.Array,
    amax_scope: jax.Array | None,
    *,
    elem: formats.ElementFormat,
    rounding: str = "rne",
    key: jax.Array | None = None,
    index=None,
) -> Scaled:
    """Two-level E4M3 block scaling, jax.nn convention (see module docstring).

    A block whose scale is 0 (a zero block, or tiny values whose scale underflows in E4M3)
    dequantizes to 0. Its nonzero elements become +-6 (x / 0 = +-inf, clipped), exactly as in
    jax's quantizer; its zero elements stay 0, where jax computes 0/0 = NaN.
    """
    # Written with the same divisions as jax's quantizer (x / g, amax / 6, x / s_b): XLA
    # compiles a / broadcast(b) as a * (1 / b) in both, which keeps them bit-identical.
    # Below float32's normal range (a scope amax under 2688 * 2**-126), g is the IEEE subnormal
    # (`subnormal.divide`) and x / g is x * (1 / g) as XLA compiles it, 1 / g to 24 bits (it would
    # overflow float32 for g < 2**-128), through operands lifted by 2**64.
    six = jnp.float32(elem.max)
    if amax_scope is None:
        g = jnp.float32(1.0)
    else:
        g = subnormal.divide(amax_scope, 6.0 * 448.0)  # >= 2**-138 for a normal amax
        g = jnp.where(subnormal.below_normal(amax_scope), jnp.float32(1.0), g)  # it reads as 0
    lifted = (xb * subnormal.opaque(2.0**subnormal.SHIFT)) * (jnp.float32(1.0) / subnormal.lift(g))
    x = jnp.where(subnormal.below_normal(g), lifted, xb / g)
    amax_b = block_amax(x)
    s_b, scale = _e4m3(jnp.clip(amax_b / six, 0, E4M3_MAX), amax_b)
    v = jnp.where(x == 0, x, x / s_b)
    q = _elements(v, elem, rounding, key, index)
    return Scaled(q, scale, _outer(g, amax_scope))


def mx(
    xb: jax.Array,
    *,
    elem: formats.ElementFormat,
    scale_rounding: str = "floor",
    rounding: str = "rne",
    key: jax.Array | None = None,
    amax_b: jax.Array | None = None,
    index=None,
) -> Scaled:
    """OCP MX block scaling with an E8M0 shared exponent (see module docstring).

    amax_b: the block amaxes of xb (`block_amax`), when the caller has them already.
    """
    amax_b = block_amax(xb) if amax_b is None else amax_b
    if scale_rounding == "floor":
        e = formats.exponent(jnp.where(amax_b > 0, amax_b, 1.0)) - elem.emax
        e = jnp.where(amax_b > 0, jnp.clip(e, -127, 127), -127)
    elif scale_rounding == "ceil":  # amax_b / max_elem as IEEE float32, subnormals included
        e = formats.exponent(formats.round_pow2(subnormal.divide(amax_b, elem.max), "ceil"))
    else:
        raise ValueError(f"scale_rounding={scale_rounding!r}; allowed: 'floor', 'ceil'")
    # At most 127 - emax_elem, so that max_elem * 2**e stays finite in float32: "ceil" on an
    # amax within a factor ~2 of FLT_MAX would otherwise round elements up to inf after
    # dequantization. "floor" never reaches the cap.
    e = jnp.minimum(e, 127 - elem.emax)
    scale = formats.pow2(e)
    # x * 2**-e, not x / 2**e: the same exact result, but 2**-e is a normal float32 for
    # e in [-127, 125], while the divisor 2**-127 is a subnormal that flush-to-zero backends
    # (XLA on CPU) read as 0, turning a zero block into 0/0 = NaN.
    q = _elements(xb * formats.pow2(-e), elem, rounding, key, index)
    return Scaled(q, _nan_where_nonfinite(scale, amax_b), jnp.float32(1.0))


def fp32_blocks(
    xb: jax.Array,
    *,
    elem: formats.ElementFormat,
    rounding: str = "rne",
    key=None,
    amax_b=None,
    index=None,
) -> Scaled:
    """Block scale in FP32: s_b = amax_b / max_elem (1 for a zero block); q = elem(x / s_b)."""
    amax_b = block_amax(xb) if amax_b is None else amax_b
    s_b = _div(amax_b, jnp.float32(elem.max))
    s_b = jnp.where(s_b == 0, jnp.float32(1.0), s_b)
    q = _elements(_div(xb, s_b), elem, rounding, key, index)
    return Scaled(q, _nan_where_nonfinite(s_b, amax_b), jnp.float32(1.0))


def per_scope(
    xb: jax.Array,
    amax_scope: jax.Array | None,
    *,
    elem: formats.ElementFormat,
    rounding: str = "rne",
    key=None,
    index=None,
) -> Scaled:
    """No block scale: one FP32 scale per scope, as FP8 "current scaling" in TE.

    scale = min(max_elem / amax_scope, FLT_MAX) (1 where amax is 0), q = elem(clamp(x * scale)),
    x_hat = q * (1 / scale), as TE's reference does it. Without a scope (outer "none") this is a
    plain saturating cast.
    """
    one = jnp.ones((1,) * xb.ndim, jnp.float32)
    if amax_scope is None:
        q = _elements(xb, elem, rounding, key, index)
        return Scaled(q, one, _nan_carrier(xb, elem, one, jnp.float32(1.0)))
    enc = jnp.minimum(jnp.float32(elem.max) / amax_scope, FLT_MAX)
    bad = (amax_scope == 0) | (enc == 0) | ~jnp.isfinite(enc)
    enc = jnp.where(bad, jnp.float32(1.0), enc)
    q = _elements(xb * enc, elem, rounding, key, index)
    outer = _outer(subnormal.reciprocal(enc), amax_scope)  # a subnormal for enc > 2**126
    return Scaled(q, one, _nan_carrier(xb, elem, amax_scope, outer))


def _nan_carrier(xb, elem: formats.ElementFormat, scope: jax.Array, outer: jax.Array):
    """`outer`, NaN over every scope (cells of `scope`'s shape) that holds a NaN of xb, for
    an element format without a NaN code.

    With a block scale, a NaN input makes its block's amax, hence its scale, non-finite. A
    scope's own outer scale already does so when its amax comes from xb; a given amax
    (delayed scaling) or no scope at all ("none") leaves the NaN nowhere but in the element,
    whose code would read it back as 0. Here it goes into the outer scale instead.
    """
    if elem.has_nan:
        return outer
    pairs = enumerate(zip(xb.shape, scope.shape, strict=True))
    axes = tuple(i for i, (n, m) in pairs if m == 1 and n != 1)
    holds_nan = jnp.any(jnp.isnan(xb), axis=axes, keepdims=True)
    return jnp.where(holds_nan, jnp.float32(np.nan), outer)
