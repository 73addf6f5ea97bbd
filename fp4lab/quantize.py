"""QuantSpec, quantize / dequantize / fake_quant, QTensor.

    import fp4lab as fl
    spec = fl.nvfp4()           # E2M1, 1x16 tiles, E4M3 block scale, FP32 tensor scale
    q = fl.quantize(x, spec)    # QTensor: codes (uint8), block scales, outer scale
    x_hat = q.dequantize()      # same shape and dtype as x
    y = fl.fake_quant(x, spec)  # = quantize(x, spec).dequantize(), straight-through grad

Blocks run along `spec.axis` (default -1, the contraction axis). 2D tiles (ty, tx) also block
the axis before it (after moving `axis` last), as weight tiles of 16x16 do.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from fp4lab import formats as F
from fp4lab import scaling as S
from fp4lab import transforms as T

__all__ = [
    "QuantSpec",
    "QTensor",
    "quantize",
    "fake_quant",
    "nvfp4",
    "mxfp4",
    "mxfp8",
    "fp8",
    "cast_spec",
]

_BLOCK_SCALES = ("e4m3", "e8m0", "fp32", None)
_OUTERS = ("none", "tensor", "row")
_ROUNDINGS = ("rne", "stochastic")
_SCALE_ROUNDINGS = ("floor", "ceil")
_FOUR_OVER_SIX = (None, "mae", "mse")
_CONVENTIONS = ("te", "jax")


def _allowed(field: str, value: Any, allowed) -> ValueError:
    return ValueError(f"QuantSpec.{field}={value!r}; allowed: {', '.join(map(repr, allowed))}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantSpec:
    """How one tensor is quantized. Frozen and hashable: usable as a static jit argument."""

    elem: str = "e2m1"  # element format (formats.format_names())
    tile: tuple[int, int] | None = (1, 16)  # (ty, tx) along (axis-1, axis); None: no block scale
    block_scale: str | None = "e4m3"  # "e4m3" | "e8m0" | "fp32" | None
    outer: str = "tensor"  # second-level FP32 scale: "none" | "tensor" | "row"
    scale_rounding: str = "floor"  # E8M0 exponent: "floor" (OCP MX) | "ceil" (RCEIL)
    rounding: str = "rne"  # element rounding: "rne" | "stochastic"
    transform: T.Hadamard | None = None  # rotation applied along `axis` before quantizing
    four_over_six: str | None = None  # None | "mae" | "mse" (NVFP4 "te" only)
    convention: str = "te"  # NVFP4 two-level rule: "te" | "jax"
    axis: int = -1  # contraction axis; blocks run along it
    pad: bool = False  # zero-pad axes the tile does not divide instead of raising
    amax_history: int = 0  # delayed scaling: outer amax from the last n steps (0 = current)
    amax_algo: str = "max"  # delayed scaling: "max" of the history | "most_recent"

    def __post_init__(self):
        F.get_format(self.elem)  # raises with the allowed names
        if isinstance(self.tile, int):
            object.__setattr__(self, "tile", (1, self.tile))
        if self.tile is not None:
            tile = tuple(int(t) for t in self.tile)
            if len(tile) != 2 or min(tile) < 1:
                raise ValueError(f"QuantSpec.tile={self.tile!r}; allowed: (ty, tx) >= 1 or None")
            object.__setattr__(self, "tile", tile)
        for field, allowed in [
            ("block_scale", _BLOCK_SCALES),
            ("outer", _OUTERS),
            ("rounding", _ROUNDINGS),
            ("scale_rounding", _SCALE_ROUNDINGS),
            ("four_over_six", _FOUR_OVER_SIX),
            ("convention", _CONVENTIONS),
        ]:
            if getattr(self, field) not in allowed:
                raise _allowed(field, getattr(self, field), allowed)
        if self.transform is not None and not isinstance(self.transform, T.Hadamard):
            raise ValueError(f"QuantSpec.transform={self.transform!r}; allowed: Hadamard or None")
        if (self.tile is None) != (self.block_scale is None):
            raise ValueError(
                f"QuantSpec.tile={self.tile!r} with block_scale={self.block_scale!r}: a tile "
                "needs a block-scale format and a block-scale format needs a tile"
            )
        if self.block_scale in ("e8m0", "fp32") and self.outer != "none":
            raise ValueError(
                f"QuantSpec.outer={self.outer!r} with block_scale={self.block_scale!r}; "
                "allowed: 'none' (only E4M3 block scales take a second-level scale)"
            )
        if self.four_over_six is not None:
            if self.block_scale != "e4m3" or self.convention != "te" or self.elem != "e2m1":
                raise ValueError(
                    "QuantSpec.four_over_six needs elem='e2m1', block_scale='e4m3' and "
                    f"convention='te' (got {self.elem!r}, {self.block_scale!r}, "
                    f"{self.convention!r})"
                )
            if self.rounding != "rne":
                raise ValueError("QuantSpec.four_over_six works with rounding='rne' only")
            if self.tile not in ((1, 16), (16, 16)):
                raise ValueError(
                    f"QuantSpec.four_over_six needs tile (1, 16) or (16, 16), got {self.tile}"
                )
        if self.outer == "row" and self.tile is not None and self.tile[0] != 1:
            raise ValueError(
                f"QuantSpec.outer='row' with 2D tile {self.tile}: a tile spanning rows cannot "
                "share one per-row scale; use a 1D tile"
            )
        kind = F.get_format(self.elem).kind
        if kind == "cast" and (self.tile is not None or self.outer != "none"):
            raise ValueError(
                f"pass-through format {self.elem!r} takes no scales: use "
                "tile=None, block_scale=None, outer='none' (fl.cast_spec)"
            )
        if self.amax_algo not in ("max", "most_recent"):
            raise _allowed("amax_algo", self.amax_algo, ("max", "most_recent"))
        if self.amax_history < 0 or (self.amax_history and self.outer != "tensor"):
            raise ValueError(
                f"QuantSpec.amax_history={self.amax_history} with outer={self.outer!r}: delayed "
                "scaling needs amax_history >= 1 and outer='tensor' (0 = current scaling)"
            )
        if self.amax_history and self.transform is not None:
            raise ValueError(
                "QuantSpec.amax_history: delayed scaling of a rotated operand is "
                "not supported (its amax is taken after the rotation)"
            )

    def replace(self, **changes) -> QuantSpec:
        """A copy with some fields changed (validated like a new spec)."""
        return dataclasses.replace(self, **changes)

    @property
    def needs_key(self) -> bool:
        return self.rounding == "stochastic" or (
            self.transform is not None and self.transform.needs_key
        )


def nvfp4(
    *, tile=(1, 16), scope: str = "tensor", four_over_six: str | None = None, **kw
) -> QuantSpec:
    """NVFP4: E2M1 elements, 16-element blocks, E4M3 block scales, an FP32 outer scale.

    scope: "tensor" or "row" (per-token outer scale, batch invariant). tile=(16, 16) gives the
    2D weight tiles of NVIDIA's pretraining recipe (arXiv 2509.25149). four_over_six: "mae" or
    "mse" (Cook et al. 2025; the outer scale then uses E4M3 max 256).
    """
    return QuantSpec(
        elem="e2m1", tile=tile, block_scale="e4m3", outer=scope, four_over_six=four_over_six, **kw
    )


def mxfp4(*, scale_rounding: str = "floor", tile=(1, 32), **kw) -> QuantSpec:
    """MXFP4 (OCP MX v1.0): E2M1 elements, 32-blocks, E8M0 scales ("floor" OCP, "ceil" RCEIL)."""
    return QuantSpec(
        elem="e2m1",
        tile=tile,
        block_scale="e8m0",
        outer="none",
        scale_rounding=scale_rounding,
        **kw,
    )


def mxfp8(*, scale_rounding: str = "floor", elem: str = "e4m3", tile=(1, 32), **kw) -> QuantSpec:
    """MXFP8: E4M3 (or E5M2) elements, 32-blocks, E8M0 scales."""
    return QuantSpec(
        elem=elem, tile=tile, block_scale="e8m0", outer="none", scale_rounding=scale_rounding, **kw
    )


def fp8(elem: str = "e4m3", *, scope: str = "tensor", **kw) -> QuantSpec:
    """FP8 with one FP32 scale per tensor (or per row): TransformerEngine's current scaling."""
    if elem not in ("e4m3", "e5m2"):
        raise ValueError(f"fp8 elem={elem!r}; allowed: 'e4m3', 'e5m2'")
    return QuantSpec(elem=elem, tile=None, block_scale=None, outer=scope, **kw)


def cast_spec(dtype: str) -> QuantSpec:
    """A pass-through cast, e.g. cast_spec("bf16"): round to the dtype and back."""
    return QuantSpec(elem=dtype, tile=None, block_scale=None, outer="none")


# ---------------------------------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QTensor:
    """A quantized tensor.

    codes: uint8 element codes (pass-through casts: the cast values), laid out with `spec.axis`
        moved last and zero padding kept, shape (..., R, K).
    scale: float32 block scales, shape (..., R/ty, 1, K/tx, 1): values exactly representable in
        the block-scale format (NaN for a scope computed from non-finite input).
    outer: float32 outer dequantization factor, broadcastable against the blocks.
    x_hat = decode(codes) * scale * outer, then unpadded, unrotated and moved back.
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
        fmt = F.get_format(self.spec.elem)
        if fmt.kind == "cast":
            return self.codes.astype(jnp.float32)
        return F.decode(self.codes, fmt)

    def dequantize(self, *, rotated: bool = False) -> jax.Array:
        """x_hat in x's shape and dtype. rotated=True keeps the Hadamard domain (for GEMMs)."""
        tile = _tile(self.spec, self.codes.shape)
        xb = S.block_view(self.values(), tile)
        x = S.unblock(xb * self.scale * self.outer)
        return _restore(x, self.spec, self.shape, self.dtype, self.transform_key, rotated)


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


def _restore(xt, spec, shape, dtype, transform_key, rotated):
    ndim = len(shape)
    axis = spec.axis if spec.axis >= 0 else ndim + spec.axis
    moved = list(shape)
    moved.append(moved.pop(axis))
    if spec.transform is not None:
        if not rotated:
            xt = T.unrotate(xt, spec.transform, transform_key)
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
    k_round, k_transform = jax.random.split(key)
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
    """
    x = jnp.asarray(x)
    xb, scaled, scope, transform_key = _quantize_blocks(x, spec, key, transform_key, amax)
    fmt = F.get_format(spec.elem)
    if fmt.kind == "cast":
        codes = S.unblock(xb).astype(fmt.dtype)
    else:
        codes = F.encode(S.unblock(scaled.q), fmt)
    outer = _outer(scaled, scope)
    return QTensor(codes, scaled.scale, outer, transform_key, spec, x.shape, x.dtype)


def _quantize_blocks(x, spec: QuantSpec, key, transform_key, amax):
    """The quantizer without codes: (xb, scaled, scope amax, transform key).

    xb: the prepared (moved, padded, rotated) float32 input in its blocked view; scaled: the
    element grid values and scales of `scaling`; pass-through casts give the cast values with
    unit scales. `quantize` encodes the grid values; `quantize_dequantize` and the telemetry
    use them directly.
    """
    if not isinstance(spec, QuantSpec):
        raise ValueError(f"quantize needs a QuantSpec, got {type(spec).__name__}")
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"quantize needs a floating-point array, got {x.dtype}")
    k_round, k_t = _split(key, spec, transform_key)
    if transform_key is None:
        transform_key = k_t
    xt = _prepare(x, spec)
    if spec.transform is not None:
        xt = T.rotate(xt, spec.transform, transform_key)
    fmt = F.get_format(spec.elem)
    xb = S.block_view(xt, _tile(spec, xt.shape))
    if fmt.kind == "cast":
        one = jnp.ones((1,) * (xt.ndim + 2), jnp.float32)
        q = xb.astype(fmt.dtype).astype(jnp.float32)
        return xb, S.Scaled(q, one, jnp.float32(1.0)), None, transform_key
    amax_b = S.block_amax(xb) if spec.block_scale is not None else None
    if amax is None or spec.outer == "none":
        scope = S.scope_amax(xb, spec.outer, amax_b)
    else:
        scope = _scope_from(amax, xb, spec.outer)
    return xb, _scale(xb, scope, spec, fmt, k_round, amax_b), scope, transform_key


def _grid_values(q: jax.Array, fmt: F.ElementFormat) -> jax.Array:
    """decode(encode(q)) for element grid values q, computed without the codes.

    Grid values round-trip exactly, except where a format has no code for them: NaN becomes 0
    in formats without a NaN code (the NaN lives in the block scale), and integers have no -0.
    """
    if fmt.kind == "int":
        return jnp.where(jnp.isnan(q) | (q == 0), jnp.float32(0.0), q)
    if fmt.kind == "float":
        if fmt.name in ("e4m3", "e5m2"):  # NaN codes; saturated q holds no infinities
            return q
        return jnp.where(jnp.isnan(q), jnp.float32(0.0), q)
    if fmt.kind == "cast":
        return q
    return F.decode(F.encode(q, fmt), fmt)


def _scope_from(amax, xb, outer):
    """A given scope amax in the shape of `S.scope_amax`: one value, or one per row ("row").

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


def _scale(xb, scope, spec: QuantSpec, fmt, key, amax_b) -> S.Scaled:
    if spec.block_scale == "e4m3":
        if spec.convention == "te":
            return S.nvfp4_te(
                xb,
                scope,
                elem=fmt,
                rounding=spec.rounding,
                key=key,
                four_over_six=spec.four_over_six,
                amax_b=amax_b,
            )
        return S.nvfp4_jax(xb, scope, elem=fmt, rounding=spec.rounding, key=key)
    if spec.block_scale == "e8m0":
        return S.mx(
            xb,
            elem=fmt,
            scale_rounding=spec.scale_rounding,
            rounding=spec.rounding,
            key=key,
            amax_b=amax_b,
        )
    if spec.block_scale == "fp32":
        return S.fp32_blocks(xb, elem=fmt, rounding=spec.rounding, key=key, amax_b=amax_b)
    return S.per_scope(xb, scope, elem=fmt, rounding=spec.rounding, key=key)


def quantize_dequantize(x, spec, *, key=None, transform_key=None, amax=None, rotated=False):
    """x_hat of `quantize` in one call (no straight-through gradient; see `fake_quant`).

    The same values as `quantize(...).dequantize(rotated=rotated)`, computed from the element
    grid values without encoding them to codes and decoding them back.
    """
    x = jnp.asarray(x)
    xb, scaled, scope, transform_key = _quantize_blocks(x, spec, key, transform_key, amax)
    xhat_b = _dequantize_blocks(scaled, F.get_format(spec.elem), scope)
    return _restore(S.unblock(xhat_b), spec, x.shape, x.dtype, transform_key, rotated)


def _dequantize_blocks(scaled: S.Scaled, fmt: F.ElementFormat, scope) -> jax.Array:
    """x_hat in the blocked view: grid values * block scale * outer, as `QTensor.dequantize`."""
    return _grid_values(scaled.q, fmt) * scaled.scale * _outer(scaled, scope)


def _outer(scaled: S.Scaled, scope) -> jax.Array:
    """The outer scale, broadcast to the scope amax's shape (one per row or one per tensor)."""
    return jnp.broadcast_to(scaled.outer, scope.shape) if scope is not None else scaled.outer


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
    """
    if spec is None:
        return x
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
        xr = T.rotate(jnp.moveaxis(x, axis, -1), spec.transform, transform_key)
        x = jnp.moveaxis(xr, -1, axis).astype(x.dtype)
    return _ste(x, x_hat)
