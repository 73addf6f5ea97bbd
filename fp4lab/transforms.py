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

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Hadamard", "sylvester", "rotate", "unrotate"]


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
        sylvester(self.size)  # validates the size
        if isinstance(self.signs, str):
            if self.signs not in ("none", "random"):
                raise ValueError(
                    f"Hadamard.signs={self.signs!r}; allowed: 'none', 'random' or a tuple of +-1"
                )
        else:
            signs = tuple(float(s) for s in self.signs)
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

    @property
    def needs_key(self) -> bool:
        return self.signs == "random"

    def matrix(self, key: jax.Array | None = None) -> jax.Array:
        """R = diag(s) H / sqrt(n) as a float32 (n, n) array."""
        h = jnp.asarray(sylvester(self.size)) * jnp.float32(1.0 / np.sqrt(self.size))
        if self.signs == "none":
            return h
        if self.signs == "random":
            if key is None:
                raise ValueError("Hadamard(signs='random') needs a key; none was given")
            s = jax.random.rademacher(key, (self.size,), jnp.float32)
        else:
            s = jnp.asarray(self.signs, jnp.float32)
        return s[:, None] * h


def _check(x: jax.Array, t: Hadamard) -> None:
    if x.shape[-1] % t.size:
        raise ValueError(
            f"Hadamard of size {t.size} does not divide the last axis of shape {x.shape}"
        )


def rotate(x: jax.Array, t: Hadamard, key: jax.Array | None = None) -> jax.Array:
    """x R applied to consecutive blocks of t.size along the last axis (float32)."""
    _check(x, t)
    r = t.matrix(key)
    xb = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, t.size)
    out = jnp.einsum("...i,ij->...j", xb, r, precision=jax.lax.Precision.HIGHEST)
    return out.reshape(x.shape)


def unrotate(x: jax.Array, t: Hadamard, key: jax.Array | None = None) -> jax.Array:
    """x R^T blockwise along the last axis: the inverse of `rotate` (R is orthogonal)."""
    _check(x, t)
    r = t.matrix(key)
    xb = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, t.size)
    out = jnp.einsum("...j,ij->...i", xb, r, precision=jax.lax.Precision.HIGHEST)
    return out.reshape(x.shape)
