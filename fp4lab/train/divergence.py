"""Divergence detection as pure state-in / state-out functions: a result, not a crash.

A run diverges at its first non-finite loss, or at its first loss above `spike_factor` times
the median of the previous `window` losses (once that many exist). The state records the step
and the kind of the first divergence; later steps never overwrite it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["DIVERGENCE_KINDS", "Divergence", "init", "update"]

DIVERGENCE_KINDS = ("", "nonfinite", "spike")  # index 0: no divergence


class Divergence(NamedTuple):
    window: jax.Array  # the last `window` losses (NaN: not yet)
    step: jax.Array  # int32 step of the first divergence, -1 = none
    kind: jax.Array  # int32 index into DIVERGENCE_KINDS


def init(window: int) -> Divergence:
    return Divergence(jnp.full((window,), jnp.nan, jnp.float32), jnp.int32(-1), jnp.int32(0))


def update(state: Divergence, loss: jax.Array, t: jax.Array, spike_factor: float) -> Divergence:
    """The state after step t with training loss `loss`."""
    full = jnp.all(jnp.isfinite(state.window))
    median = jnp.median(state.window)
    spike = full & (loss > spike_factor * median)
    bad = ~jnp.isfinite(loss)
    new_kind = jnp.where(bad, 1, jnp.where(spike, 2, 0)).astype(jnp.int32)
    first = (state.step < 0) & (new_kind > 0)
    step = jnp.where(first, t.astype(jnp.int32), state.step)
    kind = jnp.where(first, new_kind, state.kind)
    window = jnp.roll(state.window, -1).at[-1].set(loss)
    return Divergence(window, step, kind)
