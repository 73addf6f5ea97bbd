"""Hadamard rotations applied blockwise along the contraction axis before quantization.

A rotation R = diag(s) H_n / sqrt(n) (Sylvester H_n with entries +-1, an optional sign vector s)
is orthogonal, so rotating both operands of a GEMM along their contraction axis leaves the
product unchanged in exact arithmetic: (x R)(w^T R)^T = x R R^T w = x w. It spreads outliers
across a block, which shrinks the block maximum relative to the typical value.

Sign choices, as in the literature:
  signs="none"    deterministic Sylvester Hadamard (Cim et al. 2026, arXiv 2605.09825: the
                  variant that keeps MXFP4 training stable)
  signs=(+1, ...) a fixed sign vector (NVIDIA 2025, arXiv 2509.25149: one random vector, fixed)
  signs="random"  a fresh sign vector drawn from the transform key of each call
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fp4lab.schema import check_fields

__all__ = ["Hadamard", "sylvester", "rotate", "unrotate", "signs", "scale_split"]


@functools.cache
def sylvester(n: int) -> np.ndarray:
    """The n x n Sylvester Hadamard matrix with entries +-1 (n a power of two)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {n}")
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


@dataclasses.dataclass(frozen=True)
class Hadamard:
    """A blockwise Hadamard rotation of size n (16 or 32 in the recipes; any power of two).

    signs: "none", "random" (drawn from the transform key at each call) or a tuple of n values
    in {+1, -1}. Use `Hadamard.fixed_random(n, seed)` for one random vector fixed for a run.
    """

    size: int = 16  # block length n; must divide the contraction axis
    signs: str | tuple = "none"  # "none" | "random" | tuple of +-1

    def __post_init__(self):
        if isinstance(self.size, bool) or not isinstance(self.size, int):
            raise ValueError(f"Hadamard.size={self.size!r}; allowed: a power of two")
        sylvester(self.size)  # validates the size
        if isinstance(self.signs, str):
            if self.signs not in ("none", "random"):
                raise ValueError(
                    f"Hadamard.signs={self.signs!r}; allowed: 'none', 'random' or a tuple of +-1"
                )
        else:
            try:
                signs = tuple(float(s) for s in self.signs)
            except (TypeError, ValueError):
                signs = ()
            if len(signs) != self.size or any(s not in (1.0, -1.0) for s in signs):
                raise ValueError(
                    f"Hadamard.signs must hold {self.size} values of +-1, got {self.signs!r}"
                )
            object.__setattr__(self, "signs", signs)

    @classmethod
    def fixed_random(cls, size: int, seed: int = 0) -> Hadamard:
        """A Hadamard with one random sign vector, fixed by `seed` (reproducible, hashable)."""
        rng = np.random.default_rng(seed)
        return cls(size, tuple(rng.choice([-1.0, 1.0], size)))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: {"size": n, "signs": "none" | "random" | [+-1.0, ...]}; `from_dict`
        inverts it."""
        signs = self.signs if isinstance(self.signs, str) else list(self.signs)
        return {"size": self.size, "signs": signs}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Hadamard:
        """The rotation `to_dict` wrote (a missing field takes its default).

        Raises:
          ValueError: not a dict, an unknown field (named) or a bad value.
        """
        return cls(**check_fields("Hadamard", d, [f.name for f in dataclasses.fields(cls)]))

    @property
    def needs_key(self) -> bool:
        return self.signs == "random"

    def matrix(self, key: jax.Array | None = None) -> jax.Array:
        """R = diag(s) H / sqrt(n) as a float32 (n, n) array."""
        h = jnp.asarray(sylvester(self.size)) * jnp.float32(1.0 / np.sqrt(self.size))
        s = signs(self, key)
        return h if s is None else s[:, None] * h


def scale_split(n: int) -> tuple[int, float]:
    """(k, rest): 1 / sqrt(n) as 2**-k, applied before the butterflies, times rest after them
    (1, or 1 / sqrt(2) for odd log2(n))."""
    k = (n.bit_length() - 1) // 2
    return k, float(2.0**k / np.sqrt(n))


def signs(t: Hadamard, key: jax.Array | None) -> jax.Array | None:
    """The sign vector s of R = diag(s) H / sqrt(n) (float32, (n,)), or None for "none"."""
    if t.signs == "none":
        return None
    if t.signs == "random":
        if key is None:
            raise ValueError("Hadamard(signs='random') needs a key; none was given")
        return jax.random.rademacher(key, (t.size,), jnp.float32)
    return jnp.asarray(t.signs, jnp.float32)


def _butterflies(xb: jax.Array, axis: int) -> jax.Array:
    """xb H / sqrt(n) (H Sylvester, symmetric) along `axis` of xb (the block axis, of length
    n), by butterflies; the same additions in the same order wherever the axis lies, so the
    bits do not depend on it.

    Written as explicit additions (a fast Walsh-Hadamard transform) rather than a dot: XLA
    does not reorder them, so the bits are the same eagerly, under jit and at every
    optimization level (a dot's accumulation order is the backend's choice, and differed
    between eager and jitted code). 1 / sqrt(n) is split into an exact power of two applied
    before the additions (for inputs near FLT_MAX, summing first would overflow) and, for odd
    log2(n), a factor 1 / sqrt(2) applied after them.

    The power of two is applied to the bits (`_times_pow2`), not multiplied: LLVM may contract
    a multiply with the addition after it into a fused multiply-add (at XLA's default
    optimization, on CPUs with FMA), which keeps a product below 2**-126 that the multiply
    alone flushes; the first additions' bits for inputs within 4x of 2**-126 were then LLVM's
    choice, and changed with the fusions around them. With no multiply before the additions,
    the bits are the written operations' at every optimization level (tests/core/test_hadamard
    holds them to a float32 flush-to-zero formula). Two stages run per pass over the operand
    (`_two_stages`): XLA makes a fusion of each stacked pass, and a fusion per stage was 2.2
    ms of a 2048 x 1024 operand's 16-point rotation in `benchmarks/step.py --model user`.
    """
    n = xb.shape[axis]
    k, rest = scale_split(n)
    xb = _times_pow2(xb, -k)
    h = 1
    while h < n:
        if 4 * h <= n:
            xb, h = _two_stages(xb, axis, h), 4 * h
        else:  # the last stage of an odd log2(n)
            xb, h = _one_stage(xb, axis, h), 2 * h
    return xb if rest == 1.0 else xb * jnp.float32(rest)


def _halves(y: jax.Array, axis: int):
    """The two halves of y's `axis` (of length 2), that axis dropped."""
    return tuple(jax.lax.index_in_dim(y, i, axis, keepdims=False) for i in (0, 1))


def _one_stage(xb: jax.Array, axis: int, h: int) -> jax.Array:
    """The butterflies h apart: (a, b) = (x[i], x[i + h]) -> (a + b, a - b)."""
    n, lead, trail = xb.shape[axis], xb.shape[:axis], xb.shape[axis + 1 :]
    a, b = _halves(xb.reshape(*lead, n // (2 * h), 2, h, *trail), axis + 1)
    return jnp.stack([a + b, a - b], axis + 1).reshape(xb.shape)


def _two_stages(xb: jax.Array, axis: int, h: int) -> jax.Array:
    """The butterflies h apart, then 2h apart, in one pass: (a, b, c, d) = x[i], x[i + h],
    x[i + 2h], x[i + 3h] -> p, q, r, s = a + b, a - b, c + d, c - d -> (p + r, q + s, p - r,
    q - s), the additions `_one_stage` twice makes."""
    n, lead, trail = xb.shape[axis], xb.shape[:axis], xb.shape[axis + 1 :]
    low, high = _halves(xb.reshape(*lead, n // (4 * h), 2, 2, h, *trail), axis + 1)
    (a, b), (c, d) = _halves(low, axis + 1), _halves(high, axis + 1)
    p, q, r, s = a + b, a - b, c + d, c - d
    low, high = jnp.stack([p + r, q + s], axis + 1), jnp.stack([p - r, q - s], axis + 1)
    return jnp.stack([low, high], axis + 1).reshape(xb.shape)


def _times_pow2(x: jax.Array, e: int) -> jax.Array:
    """x * 2**e (e <= 0) for float32 x, from the bits: exact, inf and NaN kept, and a result
    below 2**-126 (or a subnormal x) a zero of x's sign, as the multiply gives under XLA's
    CPU flush-to-zero (on a backend that keeps subnormals, a multiply would keep them; this
    flushes everywhere). No float operation, so nothing for LLVM to contract."""
    if e == 0:
        return x
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    biased = (bits >> 23) & 0xFF
    sign = bits & jnp.uint32(0x80000000)
    shifted = bits - jnp.uint32(-e << 23)
    out = jnp.where(biased == 0xFF, bits, jnp.where(biased > -e, shifted, sign))
    return jax.lax.bitcast_convert_type(out, jnp.float32)


def _blocks_along(x: jax.Array, t: Hadamard, axis: int):
    """(x as float32 with `axis` split into (blocks, t.size), the block axis, the signs' shape)."""
    axis = axis % x.ndim
    if x.shape[axis] % t.size:
        raise ValueError(
            f"Hadamard of size {t.size} does not divide axis {axis} of shape {x.shape}"
        )
    shape = (*x.shape[:axis], x.shape[axis] // t.size, t.size, *x.shape[axis + 1 :])
    signs_shape = (t.size,) + (1,) * (x.ndim - 1 - axis)
    return x.astype(jnp.float32).reshape(shape), axis + 1, signs_shape


def rotate(x: jax.Array, t: Hadamard, key: jax.Array | None = None, *, axis: int = -1):
    """x R applied to consecutive blocks of t.size along `axis` (float32).

    The result does not depend on where the axis lies: rotating along axis 0 equals moving
    axis 0 last, rotating and moving it back, bit for bit (the quantizer relies on it to skip
    the transposes)."""
    xb, ax, signs_shape = _blocks_along(x, t, axis)
    s = signs(t, key)
    if s is not None:
        xb = xb * jnp.broadcast_to(s.reshape(signs_shape), xb.shape)  # x diag(s) H / sqrt(n)
    return _butterflies(xb, ax).reshape(x.shape)


def unrotate(x: jax.Array, t: Hadamard, key: jax.Array | None = None, *, axis: int = -1):
    """x R^T blockwise along `axis`: the inverse of `rotate` (R is orthogonal)."""
    xb, ax, signs_shape = _blocks_along(x, t, axis)
    out = _butterflies(xb, ax)
    s = signs(t, key)
    if s is not None:
        out = out * jnp.broadcast_to(s.reshape(signs_shape), out.shape)  # x H diag(s) / sqrt(n)
    return out.reshape(x.shape)
