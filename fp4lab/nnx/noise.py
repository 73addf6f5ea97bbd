"""The zero-mean part of a quantized gradient's noise: more draws of the quantization randomness.

The quantized gradient g_q is random through the quantization keys (stochastic rounding, random
Hadamard signs). Against the exact gradient g at the same parameters and batch its error is

    g_q - g = (E g_q - g) + (g_q - E g_q)           bias + zero-mean part

and the shadow's gnr = ||g|| / ||g_q - g|| (`fp4lab.nnx.telemetry`) sees only their sum.
`draw_gradients` computes the quantized gradient under K keys other than the run's own,
g^(1), ..., g^(K) (same parameters, batch and every other state: the model is not changed),
and `noise_stats` estimates per layer, with gbar = (1/K) sum_k g^(k):

    noise_zm   = sqrt( sum_k ||g^(k) - gbar||^2 / (K - 1) )
                 the zero-mean part's norm: its square is an unbiased estimate of
                 E||g_q - E g_q||^2
    noise_bias = sqrt( max(||gbar - g||^2 - noise_zm^2 / K, 0) )
                 the bias's norm: E||gbar - g||^2 = ||E g_q - g||^2 + E||g_q - E g_q||^2 / K,
                 so the difference (clipped at 0) estimates ||E g_q - g||^2 without gbar's
                 own variance
    gnr_zm     = ||g|| / noise_zm       (+inf where noise_zm == 0: no zero-mean noise)

A deterministic recipe (round to nearest, no random signs) gives K equal draws: noise_zm is 0
exactly and noise_bias is ||g_q - g||. noise_zm and noise_bias are norms of the gradient of the
loss function's value: a loss multiplied by a loss scale multiplies them (`unscale` divides
it out); gnr_zm is scale-invariant.

Keys. Draw k (k = 0, ..., K-1; it gives g^(k+1)) gives every quantized op (every layer of a
stacked op) the base key fold_in(fold_in(b, NOISE_TAG), k) in place of its own b and keeps its
call counter c, so a call draws fold_in(fold_in(fold_in(b, NOISE_TAG), k), c) where the run
draws fold_in(b, c): keys that the run's own stream, whose counters stay far below NOISE_TAG,
never produces. They are fixed by the model's keys at the step, so a rerun draws the same.

Accumulation. The draws run in one `lax.scan` (the quantized backward compiled once, memory of
one gradient and three accumulators): d_k = g^(k) - g^(1), S1 = sum_k d_k, S2 = sum_k d_k**2
elementwise, and per layer

    sum_k ||g^(k) - gbar||^2 = sum(S2) - ||S1||^2 / K,      gbar = g^(1) + S1 / K

(shifted by a draw, so no catastrophic cancellation; the K draws of a deterministic recipe are
the same loop body on the same inputs, so the d_k, and the sums, are exactly 0).
"""

from __future__ import annotations

import zlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lab.core import prng
from fp4lab.nnx.op import QuantizedOp
from fp4lab.schema import GRAD_NOISE_STATS, grad_key, parse_key

__all__ = [
    "NOISE_TAG",
    "Draws",
    "rekey",
    "draw_gradients",
    "noise_stats",
    "unscale",
    "check_keys",
]

NOISE_TAG = zlib.crc32(b"fp4lab.noise_keys")  # 0xc82d7b1a: far above any op's call count


class Draws(NamedTuple):
    """The K draws of the quantized Param gradient, accumulated (Param-state trees, float32)."""

    first: Any  # g^(1)
    shift_sum: Any  # S1 = sum_k (g^(k) - g^(1))
    shift_sq: Any  # S2 = sum_k (g^(k) - g^(1))**2, elementwise
    keys: int  # K


def check_keys(noise_keys, where: str = "noise_keys") -> int:
    """`noise_keys` as an int: 0 (off) or >= 2 (a spread needs two draws); else ValueError."""
    if isinstance(noise_keys, bool) or not isinstance(noise_keys, int) or noise_keys < 0:
        raise ValueError(f"{where}={noise_keys!r}; allowed: 0 (off) or an int >= 2")
    if noise_keys == 1:
        raise ValueError(
            f"{where}=1; allowed: 0 (off) or an int >= 2 (the spread of the draws needs two)"
        )
    return noise_keys


def _fold(base: jax.Array, data) -> jax.Array:
    """fold_in(base, data) of every key of `base` (a key, or a stack of them: one per layer)."""
    typed = jnp.issubdtype(base.dtype, jax.dtypes.prng_key)
    lead = base.ndim if typed else base.ndim - 1  # a raw key is a uint32[2]

    def fold(b):
        return prng.fold_in(b, data)

    for _ in range(lead):
        fold = jax.vmap(fold)
    return fold(base)


def rekey(model, k) -> Any:
    """Gives every quantized op of `model` the base keys of noise draw `k` (a uint32 scalar,
    traced or not), in place: b -> fold_in(fold_in(b, NOISE_TAG), k); call counters are kept.
    Ops of deterministic recipes hold no key and are left as they are. Returns the model."""
    k = jnp.asarray(k, jnp.uint32)
    for _, op in nnx.iter_modules(model):
        if isinstance(op, QuantizedOp) and op.qbase is not None:
            op.qbase[...] = _fold(_fold(op.qbase[...], jnp.uint32(NOISE_TAG)), k)
    return model


def draw_gradients(loss_fn, model, args, kwargs, *, keys: int, has_aux: bool = False) -> Draws:
    """The Param gradients of `loss_fn(model, *args, **kwargs)` under noise draws 0..keys-1
    (`rekey`), accumulated as `Draws`. `model` is not changed: each draw runs on a copy of its
    state taken now (parameters, keys, call counters, amax histories, any other state), with
    telemetry measurement off, and what the copies update is dropped."""
    keys = check_keys(keys, "draw_gradients: keys")
    if keys == 0:
        raise ValueError("draw_gradients: keys=0; nothing to draw")
    copy = nnx.clone(model)
    for _, op in nnx.iter_modules(copy):
        if isinstance(op, QuantizedOp):  # the quantized step only: no statistics, no shadow
            op.measure = op.drift = op.shadow = False
    graphdef, state = nnx.split(copy)
    diff = nnx.DiffState(0, nnx.Param)

    def gradient(state, k):  # the state rides in (Variables of this trace), copied: rekey and
        m = rekey(nnx.merge(graphdef, state, copy=True), k)  # the call counters change the copy
        grads = nnx.grad(loss_fn, argnums=diff, has_aux=has_aux)(m, *args, **kwargs)
        grads = grads[0] if has_aux else grads
        return jax.tree.map(lambda g: g.astype(jnp.float32), grads)

    def body(carry, k):  # every draw, the first too, is this one body: equal draws, equal bits
        state, first, s1, s2 = carry
        g = gradient(state, k)
        first = jax.tree.map(lambda f, x: jnp.where(k == 0, x, f), first, g)
        d = jax.tree.map(jnp.subtract, g, first)
        s1 = jax.tree.map(jnp.add, s1, d)
        s2 = jax.tree.map(lambda s, x: s + x * x, s2, d)
        return (state, first, s1, s2), None

    shapes = jax.eval_shape(gradient, state, jnp.uint32(0))
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    draws = jnp.arange(keys, dtype=jnp.uint32)
    (_, first, s1, s2), _ = jax.lax.scan(body, (state, zeros, zeros, zeros), draws)
    return Draws(first, s1, s2, keys)


def noise_stats(layer: str, g, first, shift_sum, shift_sq, keys: int) -> dict[str, jax.Array]:
    """grad/<layer>/{noise_zm, noise_bias, gnr_zm} of one layer, from its exact gradient `g`
    and its slices of the `Draws` trees of `keys` = K >= 2 draws (float32):

        spread     = max(sum(S2) - ||S1||^2 / K, 0)         = sum_k ||g^(k) - gbar||^2
        noise_zm   = sqrt(spread / (K - 1))
        noise_bias = sqrt(max(||g^(1) + S1 / K - g||^2 - noise_zm^2 / K, 0))
        gnr_zm     = ||g|| / noise_zm, +inf where noise_zm == 0
    """
    g = g.astype(jnp.float32).ravel()
    first, s1, s2 = (v.astype(jnp.float32).ravel() for v in (first, shift_sum, shift_sq))
    spread = jnp.maximum(jnp.sum(s2) - jnp.sum(s1 * s1) / keys, 0.0)  # sum_k ||g^(k) - gbar||^2
    zm = jnp.sqrt(spread / (keys - 1))
    off = (first - g) + s1 / keys  # gbar - g
    bias = jnp.sqrt(jnp.maximum(jnp.sum(off * off) - zm * zm / keys, 0.0))
    n = jnp.linalg.norm(g)
    gnr = jnp.where(zm > 0, n / jnp.where(zm > 0, zm, 1.0), jnp.inf)
    values = dict(zip(GRAD_NOISE_STATS, (zm, bias, gnr), strict=True))
    return {grad_key(layer, stat): v for stat, v in values.items()}


def unscale(metrics: dict[str, jax.Array], scale) -> dict[str, jax.Array]:
    """`metrics` with noise_zm and noise_bias divided by `scale`: the noise of the gradient of
    the loss itself where `loss_fn` returned the loss times `scale` (loss scaling)."""
    absolute = ("noise_zm", "noise_bias")

    def is_norm(key: str) -> bool:
        parsed = parse_key(key)
        return parsed is not None and parsed.kind == "grad" and parsed.stat in absolute

    return {k: v / scale if is_norm(k) else v for k, v in metrics.items()}
