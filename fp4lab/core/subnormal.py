"""Float32 arithmetic at the bottom of the range, exact where the backend flushes subnormals.

XLA's CPU code runs with flush-to-zero and denormals-are-zero: a float32 below 2**-126 that
an operation produces is written as 0, and one it reads counts as 0. The scale rules of
`scaling` pass through that range for tiny inputs: E8M0's smallest scale is 2**-127, and an
outer scale 1 / S is subnormal for S > 2**126 (a scope amax below about 3e-35). The few
operations that can land there are computed here from the bits, with integer arithmetic and
with powers of two that keep every float operand normal, and give what IEEE float32 (gradual
underflow, round to nearest even) gives: what a device that keeps subnormals computes, and
what NumPy computes.

    reciprocal(s)          RN(1 / s)                  subnormal for s > 2**126
    divide(a, d)           RN(a / d)                  a >= 0, d a constant; subnormal results
    product_up(s, d)       RN(s * d) * 2**64          s an E4M3 value, d >= 0 maybe subnormal
    dequantize_factors(q, s, o)   x_hat = (q' * s') * o' with no subnormal operand

Inputs that are themselves float32 subnormals still read as 0 in the elementwise work (x
times a scale), as in every other operation of such a backend: they quantize as zeros (also
the few that IEEE rounding would take up to 2**-126), and a scope whose amax is below 2**-126
quantizes as an all-zero one. An x_hat below 2**-126 is written as 0 of its sign.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4lab.core import formats

__all__ = [
    "SHIFT",
    "opaque",
    "below_normal",
    "lift",
    "reciprocal",
    "divide",
    "product_up",
    "dequantize_factors",
    "grid_unit",
]

SHIFT = 64  # 2**SHIFT lifts every float32 subnormal into the normal range, exactly
_I32, _U32, _F32 = np.int32, np.uint32, np.float32
_MIN_NORMAL = _F32(2.0**-126)


def opaque(c: float) -> jax.Array:
    """The float32 constant c where XLA's simplifier cannot see it: it moves constant factors
    across products ((v * c) * s -> v * (s * c)), which would form the subnormal
    intermediates these rebalanced products avoid."""
    return lax.optimization_barrier(jnp.float32(c))


def _bits(v: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(jnp.asarray(v, jnp.float32), jnp.int32)


def _float(bits: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(bits.astype(jnp.int32), jnp.float32)


def _significand(v: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(n, e) with |v| = n * 2**e exactly, n an integer below 2**24 (v finite)."""
    b = _bits(v)
    field = (b >> 23) & 0xFF
    mant = b & 0x7FFFFF
    n = jnp.where(field == 0, mant, mant | 0x800000)
    return n, jnp.where(field == 0, -149, field - 150)


def below_normal(v: jax.Array) -> jax.Array:
    """|v| < 2**-126: v is 0 or a subnormal (a float comparison, which flush-to-zero
    arithmetic answers alike; no test here tells a subnormal from 0 by its bits, as LLVM may
    compile such a test into a float comparison with 0, which reads a subnormal as 0)."""
    return jnp.abs(v) < _MIN_NORMAL


def lift(v: jax.Array) -> jax.Array:
    """v * 2**64 exactly, for finite |v| below 2**60 (a subnormal v read from its bits)."""
    n, _ = _significand(v)
    sign = jnp.where(_bits(v) < 0, _F32(-1.0), _F32(1.0))
    lifted = sign * n.astype(jnp.float32) * _F32(2.0 ** (SHIFT - 149))
    return jnp.where(below_normal(v), lifted, v * _F32(2.0**SHIFT))


def _rne_shift(p: jax.Array, k: jax.Array) -> jax.Array:
    """p * 2**-k rounded to the nearest integer, ties to even (int32 p >= 0, k >= 0)."""
    k = jnp.minimum(k, 30)
    q = lax.shift_right_logical(p, k)
    rem = p - lax.shift_left(q, k)
    half = lax.shift_left(jnp.ones_like(k), jnp.maximum(k - 1, 0))
    up = (k > 0) & ((rem > half) | ((rem == half) & ((q & 1) == 1)))
    return q + up.astype(jnp.int32)


def reciprocal(s: jax.Array) -> jax.Array:
    """RN(1 / s) in float32 for s > 0, subnormal where s > 2**126, as IEEE arithmetic gives it.

    For s = F * 2**(E - 23) in (2**126, FLT_MAX], 1 / s = m * 2**-149 with m = RNE(2**(172 - E)
    / F) below 2**23: a float estimate of m is off by at most one, and the residual
    2**(172 - E) - m * F, computed modulo 2**32 (the power of two is 0 there) is exact, as it
    is below 2**25; it corrects the estimate and decides the rounding. Elsewhere 1 / s.
    """
    s = jnp.asarray(s, jnp.float32)
    big = (s > _F32(2.0**126)) & jnp.isfinite(s)
    safe = jnp.where(big, s, _F32(2.0**127))
    f, _ = _significand(safe)
    est = (_F32(1.0) / (safe * _F32(2.0**-SHIFT))) * _F32(2.0 ** (149 - SHIFT))
    c = jnp.round(est).astype(jnp.int32)
    prod = c.astype(jnp.uint32) * f.astype(jnp.uint32)  # modulo 2**32
    r = lax.bitcast_convert_type(_U32(0) - prod, jnp.int32)
    c, r = jnp.where(r < 0, c - 1, c), jnp.where(r < 0, r + f, r)
    c, r = jnp.where(r >= f, c + 1, c), jnp.where(r >= f, r - f, r)
    up = (2 * r > f) | ((2 * r == f) & ((c & 1) == 1))
    return jnp.where(big, _float(c + up.astype(jnp.int32)), _F32(1.0) / s)


def _odd_part(d: float) -> tuple[int, int]:
    """(odd, k) with d = odd * 2**k, for a positive float constant d."""
    m, e = np.frexp(np.float64(d))
    n, k = int(m * 2**53), int(e) - 53
    while n % 2 == 0:
        n, k = n // 2, k + 1
    return n, k


def divide(a: jax.Array, d: float) -> jax.Array:
    """RN(a / d) in float32 for finite a >= 0 and a constant d > 0 (an odd integer below 2**8
    times a power of two: 2688, the element maxima), subnormal results included.

    Where a / d is below the normal range, the quotient m * 2**-149 comes from integers:
    a * 2**(149 - k) / odd = (n * 2**t) / odd with a = n * 2**e, t = e + 149 - k, and m its
    rounding to nearest even, from the integer part's quotient and remainder by `odd` and the
    fraction's bits. Elsewhere a / d as the backend divides.
    """
    odd, k = _odd_part(d)
    if odd >= 2**8:
        raise ValueError(f"divide needs d = odd * 2**k with odd < 256, got {d!r}")
    a = jnp.asarray(a, jnp.float32)
    low = a < _F32(d * 2.0**-126)  # a / d < 2**-126 (subnormal a reads as 0 here: low too)
    n, e = _significand(jnp.where(low, a, _F32(0.0)))
    t = e + 149 - k  # a / d * 2**149 = n * 2**t / odd, below odd * 2**23 < 2**31
    whole = jnp.where(t >= 0, lax.shift_left(n, jnp.clip(t, 0, 30)), 0)
    frac_bits = jnp.clip(-t, 0, 30)
    whole = jnp.where(t < 0, lax.shift_right_logical(n, frac_bits), whole)
    frac = n - lax.shift_left(lax.shift_right_logical(n, frac_bits), frac_bits)
    q, r = whole // odd, whole % odd
    rem = lax.shift_left(r, frac_bits) + jnp.where(t < 0, frac, 0)  # (r + frac) * 2**bits
    den = lax.shift_left(jnp.full_like(frac_bits, odd), frac_bits)
    up = (2 * rem > den) | ((2 * rem == den) & ((q & 1) == 1))
    return jnp.where(low, _float(q + up.astype(jnp.int32)), a / jnp.float32(d))


def product_up(s: jax.Array, d: jax.Array) -> jax.Array:
    """RN(s * d) * 2**64: the IEEE float32 product (gradual underflow), lifted exactly by 2**64
    into the normal range, for s >= 0 with at most 4 significant bits (an E4M3 value) and
    finite d >= 0 below 2**-60 (a subnormal d read from its bits).

    With s = A * 2**j (A < 16) and d = n * 2**e, s * d = P * 2**(t - 149) with P = A * n below
    2**28 and t = j + e + 149: where P * 2**t >= 2**24 the product is normal and float(P) is
    its rounding; below, the result is RNE(P * 2**t) * 2**-149, an integer shift.
    """
    s = jnp.asarray(s, jnp.float32)
    j = formats.exponent(jnp.where(s > 0, s, _F32(1.0))) - 3
    a = jnp.where(s > 0, jnp.round(s * formats.pow2(-j)), 0.0).astype(jnp.int32)
    n, e = _significand(d)
    p = a * n
    t = j + e + 149
    normal = (31 - lax.clz(jnp.maximum(p, 1))) + t >= 24  # P * 2**t >= 2**24
    big = p.astype(jnp.float32) * formats.pow2(jnp.clip(t - 149 + SHIFT, -126, 127))
    m = jnp.where(t >= 0, lax.shift_left(p, jnp.clip(t, 0, 30)), _rne_shift(p, -t))
    small = m.astype(jnp.float32) * _F32(2.0 ** (SHIFT - 149))
    nan = jnp.isnan(s) | jnp.isnan(d)
    return jnp.where(nan, _F32(np.nan), jnp.where(normal, big, small))


def grid_unit(fmt: formats.ElementFormat) -> float:
    """The factor `dequantize_factors` puts on the grid values of `fmt` (a saturated element's
    is fmt.max times it): 1/2, or 1 for pass-through casts (no block scales)."""
    return 1.0 if fmt.kind == "cast" else 0.5


def dequantize_factors(vals, scale, outer, fmt: formats.ElementFormat):
    """(vals', scale', outer') with (vals' * scale') * outer' = (vals * scale) * outer in IEEE
    float32 (the same single roundings), and no operand below the normal range.

    vals' = vals * `grid_unit(fmt)`, scale' = scale / grid_unit (read from the bits; grid values
    are at least 2**-16, block scales below 2**126): E8M0's 2**-127 becomes 2**-126. Where the
    outer scale is subnormal (a scope's 1 / S_enc), outer' = outer * 2**64 and scale' = scale *
    2**-64 (block scales of at least 2**-9, or 1). The product is still written as the backend
    writes it: below 2**-126, XLA's CPU code flushes it to 0.
    """
    if grid_unit(fmt) != 1.0:
        b = _bits(scale)
        sign = b & jnp.int32(-(2**31))
        doubled = _float(lax.shift_left(b & 0x7FFFFFFF, 1) | sign)
        scale = jnp.where(below_normal(scale), doubled, scale * _F32(2.0))
        vals = vals * opaque(0.5)
    low = below_normal(outer)
    outer = jnp.where(low, lift(outer), outer)
    scale = scale * jnp.where(low, _F32(2.0**-SHIFT), _F32(1.0))
    return vals, scale, outer
