"""Element formats: grids, max values, round-to-nearest-even and stochastic casts, codes.

Every cast here is written with integer and power-of-two arithmetic on float32, so it is exact
and does not depend on how a backend converts to narrow dtypes. The tests hold it against
ml_dtypes, an independent implementation of the same formats.

Formats (OCP 8-bit floating point and Microscaling v1.0 specifications):

  name   bits  exponent  mantissa  bias  max        notes
  e2m1   4     2         1         1     6          FP4; no inf/nan
  e2m3   6     2         3         1     7.5        FP6; no inf/nan
  e3m2   6     3         2         3     28         FP6; no inf/nan
  e4m3   8     4         3         7     448        FP8 "fn": no inf, one nan code (0x7f)
  e5m2   8     5         2         15    57344      FP8 IEEE-like: inf and nan
  e8m0   8     8         0         127   2**127     scale format: powers of two, 0xff = nan
  int4   4     -         -         -     7          symmetric: saturates to +-7
  int8   8     -         -         -     127        symmetric: saturates to +-127
  bf16, fp16, fp32                                  pass-through casts (RNE of the dtype)

Pass-through casts are also computed with arithmetic (`cast_round`), not as a cast to the
dtype and back: XLA's excess-precision rewrites may drop such a round trip inside a fused
program, which would leave a simulated BF16 GEMM with unrounded operands. Like a dtype cast,
they overflow to +-inf and keep subnormals.

Saturation: every cast clamps to +-max before rounding, so overflow never produces inf or nan
(ml_dtypes' float8_e4m3fn would turn 464 into nan).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4lab.core import prng

__all__ = [
    "ElementFormat",
    "get_format",
    "format_names",
    "round_to_format",
    "round_scale",
    "cast_round",
    "encode",
    "decode",
    "grid",
    "exponent",
    "pow2",
]


@dataclasses.dataclass(frozen=True)
class ElementFormat:
    """A number format for quantized elements or scales.

    kind: "float" (sign-magnitude minifloat), "int" (symmetric integer), "pow2" (E8M0, unsigned
    powers of two) or "cast" (pass-through to a jax dtype).
    """

    name: str
    kind: str
    bits: int
    ebits: int = 0  # exponent bits (float kinds)
    mbits: int = 0  # mantissa bits (float kinds)
    max: float = 0.0  # largest finite magnitude; casts saturate here
    dtype: str | None = None  # jax dtype of pass-through casts

    @property
    def bias(self) -> int:
        return 2 ** (self.ebits - 1) - 1

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number (subnormals share its quantum)."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest binade (floor(log2(max)))."""
        return int(np.floor(np.log2(self.max)))

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.mbits)

    @property
    def has_nan(self) -> bool:
        """Whether the format has a NaN code (FP8, E8M0 and the dtypes do; FP4, FP6 and the
        integers do not: there a NaN input lives in a scale, see `scaling`)."""
        return self.kind in ("pow2", "cast") or self.name in ("e4m3", "e5m2")


_FORMATS = {
    f.name: f
    for f in [
        ElementFormat("e2m1", "float", 4, 2, 1, 6.0),
        ElementFormat("e2m3", "float", 6, 2, 3, 7.5),
        ElementFormat("e3m2", "float", 6, 3, 2, 28.0),
        ElementFormat("e4m3", "float", 8, 4, 3, 448.0),
        ElementFormat("e5m2", "float", 8, 5, 2, 57344.0),
        ElementFormat("e8m0", "pow2", 8, 8, 0, 2.0**127),
        ElementFormat("int4", "int", 4, max=7.0),
        ElementFormat("int8", "int", 8, max=127.0),
        ElementFormat("bf16", "cast", 16, 8, 7, float(jnp.finfo(jnp.bfloat16).max), "bfloat16"),
        ElementFormat("fp16", "cast", 16, 5, 10, float(jnp.finfo(jnp.float16).max), "float16"),
        ElementFormat("fp32", "cast", 32, 8, 23, float(jnp.finfo(jnp.float32).max), "float32"),
    ]
}

_ALIASES = {
    "fp4": "e2m1",
    "fp6_e2m3": "e2m3",
    "fp6_e3m2": "e3m2",
    "fp8_e4m3": "e4m3",
    "fp8_e5m2": "e5m2",
    "bfloat16": "bf16",
    "float16": "fp16",
    "float32": "fp32",
}


def format_names() -> tuple[str, ...]:
    """Names accepted by `get_format`."""
    return tuple(_FORMATS)


def get_format(name: str | ElementFormat) -> ElementFormat:
    """Looks a format up by name; unknown names raise a ValueError listing the known ones."""
    if isinstance(name, ElementFormat):
        return name
    key = _ALIASES.get(str(name).lower(), str(name).lower())
    if key not in _FORMATS:
        raise ValueError(f"unknown element format {name!r}; allowed: {', '.join(_FORMATS)}")
    return _FORMATS[key]


# Hot paths (the quantizer's rounding and random bits) are written with lax primitives and
# typed constants: the same operations as their jnp spelling, traced several times faster.
_I32, _U32, _F32 = np.int32, np.uint32, np.float32


# ---------------------------------------------------------------------------------------------
# Float32 bit helpers.


def exponent(a: jax.Array) -> jax.Array:
    """floor(log2(a)) for finite a > 0 in float32, read from the bits (subnormals included)."""
    bits = jax.lax.bitcast_convert_type(a.astype(jnp.float32), jnp.int32)
    e = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    # float32 subnormal: exponent = -127 + (position of the top mantissa bit) - 22.
    top = 31 - jax.lax.clz(jnp.maximum(mant, 1))
    return jnp.where(e == 0, top - 149, e - 127)


def pow2(e: jax.Array) -> jax.Array:
    """2**e as float32 for integer e in [-149, 127], built from the bits (exact)."""
    e = e.astype(jnp.int32)
    normal = jax.lax.bitcast_convert_type((jnp.clip(e, -126, 127) + 127) << 23, jnp.float32)
    sub = jax.lax.bitcast_convert_type(
        jnp.left_shift(jnp.int32(1), jnp.clip(e + 149, 0, 22)), jnp.float32
    )
    return jnp.where(e >= -126, normal, sub)


def _quantum(a: jax.Array, fmt: ElementFormat) -> tuple[jax.Array, jax.Array]:
    """(q, 1/q): the spacing of the minifloat grid at magnitude a (a >= 0, already saturated)
    and its reciprocal, both powers of two built from float32 exponent bits.

    q = 2**(max(floor(log2 a), emin) - mbits). The exponent field alone gives floor(log2 a)
    for normal a; zero and float32 subnormals (field 0) lie below every format's smallest
    normal binade, where the max with emin decides, so no leading-zero count is needed. Both
    q and 1/q are normal float32 for every format here, so a * (1/q) is exactly a / q.
    """
    field = lax.shift_right_logical(lax.bitcast_convert_type(a, jnp.int32), _I32(23))
    field = lax.bitwise_and(field, _I32(0xFF))
    k = lax.sub(lax.max(field, _I32(fmt.emin + 127)), _I32(fmt.mbits))  # biased exponent of q
    q = lax.bitcast_convert_type(lax.shift_left(k, _I32(23)), jnp.float32)
    inv = lax.bitcast_convert_type(lax.shift_left(lax.sub(_I32(254), k), _I32(23)), jnp.float32)
    return q, inv


# ---------------------------------------------------------------------------------------------
# Rounding.


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def cast_round(x: jax.Array, fmt: str | ElementFormat) -> jax.Array:
    """x rounded to a pass-through format's dtype and back, as float32 (bit-exact with
    `x.astype(dtype).astype(float32)`: round to nearest even, overflow to +-inf, subnormals
    kept, NaN stays NaN), written so that no compiler rewrite can drop it.

    bf16 rounds the float32 bits (add half an ulp of the kept bits, ties to even, clear the
    dropped ones); fp16 rounds with its power-of-two quantum (`round_to_format`'s arithmetic)
    and sends what rounds above its max to inf. The derivative is 1, as for a dtype cast.
    """
    fmt = get_format(fmt)
    if fmt.kind != "cast":
        raise ValueError(
            f"cast_round is for pass-through formats (bf16, fp16, fp32), not {fmt.name}"
        )
    x = jnp.asarray(x).astype(jnp.float32)
    if fmt.name == "fp32":
        return x
    if fmt.name == "bf16":
        u = jax.lax.bitcast_convert_type(x, jnp.uint32)
        u = (u + jnp.uint32(0x7FFF) + ((u >> 16) & 1)) & jnp.uint32(0xFFFF0000)
        return jnp.where(jnp.isnan(x), x, jax.lax.bitcast_convert_type(u, jnp.float32))
    a = jnp.abs(x)
    q, inv = _quantum(jnp.minimum(a, jnp.float32(fmt.max)), fmt)  # inf: the top binade's
    r = jnp.round(a * inv) * q
    r = jnp.where(r > fmt.max, jnp.inf, r)
    return jnp.where(jnp.isnan(x), x, jnp.copysign(r, x))


@cast_round.defjvp
def _cast_round_jvp(fmt, primals, tangents):
    (x,), (t,) = primals, tangents
    return cast_round(x, fmt), jnp.asarray(t).astype(jnp.float32)


def round_to_format(
    x: jax.Array,
    fmt: str | ElementFormat,
    *,
    rounding: str = "rne",
    key: jax.Array | None = None,
    index: jax.Array | None = None,
) -> jax.Array:
    """Rounds x onto the grid of `fmt`, saturating at +-max; returns float32 grid values.

    rounding="rne": round to nearest, ties to even. rounding="stochastic": round up with
    probability equal to the distance from the lower neighbour divided by the spacing, using
    `key` (required). The result is always one of the two grid neighbours of x, and its mean
    over keys is x for |x| <= max (to 2**-24 relative for inputs finer than the format's
    subnormal quantum). NaN stays NaN. E8M0 rounds exponents: see `round_pow2`.

    index: for stochastic rounding, the position of each element of x in the random stream
    (uint32, x's shape); default: x's own row-major order. The quantizer passes it when it
    rounds a tensor in another layout than the one its random bits are defined in.
    """
    fmt = get_format(fmt)
    if rounding not in ("rne", "stochastic"):
        raise ValueError(f"unknown rounding {rounding!r}; allowed: 'rne', 'stochastic'")
    if rounding == "stochastic" and key is None:
        raise ValueError("rounding='stochastic' needs a PRNG key; none was given")
    x = jnp.asarray(x)
    if fmt.kind == "cast":
        if rounding == "stochastic":
            raise ValueError(f"stochastic rounding is not offered for pass-through {fmt.name}")
        return cast_round(x, fmt)
    if fmt.kind == "pow2":
        return round_pow2(x, "nearest")
    x = x.astype(jnp.float32)
    a = lax.min(lax.abs(x), _F32(fmt.max))
    if fmt.kind == "int":
        q, y = _F32(1.0), a
    else:
        q, inv = _quantum(a, fmt)
        y = lax.mul(a, inv)  # = a / q, exactly: powers of two within range
    if rounding == "rne":
        r = lax.round(y, lax.RoundingMethod.TO_NEAREST_EVEN)
    else:
        lo = lax.floor(y)
        bits = prng.random_bits(key, y.shape, index)
        u = lax.convert_element_type(lax.shift_right_logical(bits, _U32(8)), jnp.float32)
        u = lax.mul(u, _F32(2.0**-24))  # uniform on [0, 1)
        up = lax.convert_element_type(lax.lt(u, lax.sub(y, lo)), jnp.float32)
        r = lax.add(lo, up)
    # r * q needs no second clamp: it is at most the grid point at or above a, and a <= max,
    # itself a grid point. It is >= +0, so x's sign is its sign bit set from x's (-0 stays -0).
    out = lax.mul(r, q)
    sign = lax.bitwise_and(lax.bitcast_convert_type(x, jnp.uint32), _U32(0x80000000))
    out = lax.bitcast_convert_type(
        lax.bitwise_or(lax.bitcast_convert_type(out, jnp.uint32), sign), jnp.float32
    )
    return lax.select(lax.ne(x, x), lax.full_like(out, np.nan), out)  # NaN stays NaN


def round_scale(
    v: jax.Array, fmt: str | ElementFormat, valid: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Scales v >= 0 rounded to nearest even onto a float format's grid, saturating at max:
    (s, s where `valid` else NaN). s is `round_to_format(v, fmt)` bit for bit (NaN stays NaN).

    For the block scales of the quantizer (E4M3 in NVFP4). Both results end in an exact
    division by a power of two (r / 2**-e, the value r * 2**e), and XLA's CPU fusion does not
    copy a division into the elementwise pass that reads its result, as it does the cheap
    operations of a rounding: the scales are computed once per block, not once per vector of
    elements (measured with `benchmarks/quantizer.py`; the README's Performance section).
    """
    fmt = get_format(fmt)
    if fmt.kind != "float":
        raise ValueError(f"round_scale rounds onto a float grid; {fmt.name} is {fmt.kind!r}")
    a = lax.min(lax.abs(jnp.asarray(v, jnp.float32)), _F32(fmt.max))  # scales: no sign
    _, inv = _quantum(a, fmt)
    r = lax.round(lax.mul(a, inv), lax.RoundingMethod.TO_NEAREST_EVEN)
    masked = lax.select(valid, r, lax.full_like(r, np.nan))
    return lax.div(r, inv), lax.div(masked, inv)


def round_pow2(x: jax.Array, mode: str = "floor") -> jax.Array:
    """Rounds positive x to a power of two in E8M0's range [2**-127, 2**127]; NaN/inf -> NaN.

    mode: "floor" (largest power <= x), "ceil" (smallest power >= x) or "nearest" (the nearer
    of the two, ties up: x >= 1.5 * 2**floor, as ml_dtypes' float8_e8m0fnu cast rounds). Zero
    and negative x map to 2**-127, the smallest E8M0 value. Exact for float32 subnormal x too.
    """
    if mode not in ("floor", "ceil", "nearest"):
        raise ValueError(f"unknown power-of-two rounding {mode!r}; allowed: floor, ceil, nearest")
    # Read from the bits only: XLA on CPU flushes float32 subnormals to zero in arithmetic and
    # comparisons, and 2**-127 (E8M0's smallest value) is a float32 subnormal.
    x = jnp.asarray(x, jnp.float32)
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)
    positive = (bits > 0) & (bits < 0x7F800000)  # finite, > 0 (subnormals included)
    e = exponent(jnp.where(positive, x, 1.0))
    frac = _fraction(bits)  # mantissa below the leading one, 23 bits
    if mode == "ceil":
        e = jnp.where(frac != 0, e + 1, e)
    elif mode == "nearest":
        e = jnp.where(frac >= 0x400000, e + 1, e)
    e = jnp.where(positive, jnp.clip(e, -127, 127), -127)
    nonfinite = (bits & 0x7FFFFFFF) >= 0x7F800000
    return jnp.where(nonfinite, jnp.nan, pow2(e))  # 2**-127 is an exact f32 subnormal


def _fraction(bits: jax.Array) -> jax.Array:
    """The 23 bits after the leading one of a float32's significand (normalized subnormals)."""
    mant = bits & 0x7FFFFF
    top = 31 - jax.lax.clz(jnp.maximum(mant, 1))
    sub = jnp.left_shift(mant, 23 - top) & 0x7FFFFF
    return jnp.where((bits & 0x7F800000) == 0, sub, mant)


# ---------------------------------------------------------------------------------------------
# Codes.


def encode(q: jax.Array, fmt: str | ElementFormat) -> jax.Array:
    """Bit pattern (uint8) of values already on the grid of `fmt` (as `round_to_format` gives).

    Floats: sign | biased exponent | mantissa, as the OCP specifications lay them out.
    Integers: two's complement in the low `bits` bits. E8M0: biased exponent, NaN -> 0xff.
    E5M2 keeps its infinities (0x7c, 0xfc). NaN encodes as 0x7f in E4M3 and E5M2.
    NaN in formats without a NaN code encodes as 0 (the NaN lives in the block scale).
    """
    fmt = get_format(fmt)
    q = jnp.asarray(q, jnp.float32)
    if fmt.kind == "int":
        v = jnp.where(jnp.isnan(q), 0, q).astype(jnp.int32)
        return (v & ((1 << fmt.bits) - 1)).astype(jnp.uint8)
    if fmt.kind == "pow2":  # from the bits: 2**-127 is a subnormal that FTZ would read as 0
        positive = jax.lax.bitcast_convert_type(q, jnp.int32) > 0
        e = exponent(jnp.where(positive, q, 1.0)) + 127
        return jnp.where(jnp.isnan(q), 255, e).astype(jnp.uint8)
    if fmt.kind == "cast":
        raise ValueError(f"{fmt.name} is a pass-through cast; it has no uint8 codes")
    a = jnp.abs(q)
    sign = (jax.lax.bitcast_convert_type(q, jnp.uint32) >> 31).astype(jnp.int32)
    e = exponent(jnp.where(a > 0, a, 1.0))
    normal = (e >= fmt.emin) & (a > 0)
    mant_normal = (a / pow2(e) - 1.0) * (1 << fmt.mbits)
    mant_sub = a / jnp.float32(fmt.min_subnormal)
    mant = jnp.where(normal, mant_normal, mant_sub).astype(jnp.int32)
    biased = jnp.where(normal, e + fmt.bias, 0)
    code = (sign << (fmt.bits - 1)) | (biased << fmt.mbits) | mant
    if fmt.name == "e4m3":
        code = jnp.where(jnp.isnan(q), 0x7F, code)
    elif fmt.name == "e5m2":
        code = jnp.where(jnp.isinf(q), (sign << 7) | 0x7C, code)
        code = jnp.where(jnp.isnan(q), 0x7F, code)
    else:
        code = jnp.where(jnp.isnan(q), 0, code)
    return code.astype(jnp.uint8)


def decode(code: jax.Array, fmt: str | ElementFormat) -> jax.Array:
    """Float32 value of uint8 codes of `fmt` (inverse of `encode`)."""
    fmt = get_format(fmt)
    c = jnp.asarray(code).astype(jnp.int32)
    if fmt.kind == "int":
        c = c & ((1 << fmt.bits) - 1)
        return jnp.where(c >= (1 << (fmt.bits - 1)), c - (1 << fmt.bits), c).astype(jnp.float32)
    if fmt.kind == "pow2":
        return jnp.where(c == 255, jnp.nan, pow2(c - 127))
    if fmt.kind == "cast":
        raise ValueError(f"{fmt.name} is a pass-through cast; it has no uint8 codes")
    sign = (c >> (fmt.bits - 1)) & 1
    biased = (c >> fmt.mbits) & ((1 << fmt.ebits) - 1)
    mant = (c & ((1 << fmt.mbits) - 1)).astype(jnp.float32)
    frac = mant / (1 << fmt.mbits)
    mag = jnp.where(
        biased == 0,
        frac * pow2(jnp.full_like(c, fmt.emin)),
        (1.0 + frac) * pow2(biased - fmt.bias),
    )
    if fmt.name == "e4m3":
        mag = jnp.where((c & 0x7F) == 0x7F, jnp.nan, mag)
    elif fmt.name == "e5m2":
        mag = jnp.where(biased == 31, jnp.where(mant == 0, jnp.inf, jnp.nan), mag)
    return jnp.where(sign == 1, -mag, mag)


@functools.cache
def grid(fmt: str | ElementFormat) -> np.ndarray:
    """Sorted non-negative finite values of `fmt` (float64 numpy), e.g. e2m1 -> [0, .5, ..., 6]."""
    fmt = get_format(fmt)
    if fmt.kind == "int":
        return np.arange(0, int(fmt.max) + 1, dtype=np.float64)
    if fmt.kind in ("pow2", "cast"):
        raise ValueError(f"{fmt.name} has no small grid to enumerate")
    codes = jnp.arange(1 << (fmt.bits - 1), dtype=jnp.uint8)
    vals = np.asarray(decode(codes, fmt), np.float64)
    return np.unique(vals[np.isfinite(vals) & (vals <= fmt.max)])
