"""Divergence detection as pure state-in / state-out functions: a result, not a crash.

A run diverges at its first step t whose loss is

    non-finite                                       (kind "nonfinite"), or
    > spike_factor x loss[0]                         (kind "spike"; from step 1, loss[0] > 0), or
    > spike_factor x median(loss[t - window : t])    (kind "spike"; once `window` losses exist)

so a blow-up counts at once whatever the history (0.83 at step 0, 6.5e8 at step 2 is a
divergence at step 2), and a later spike counts against the recent losses. The state records
the step and the kind of the first divergence; later steps never overwrite it.
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
    start: jax.Array  # the run's first loss (NaN: no step yet)


def init(window: int) -> Divergence:
    nan = jnp.float32(jnp.nan)
    return Divergence(jnp.full((window,), nan, jnp.float32), jnp.int32(-1), jnp.int32(0), nan)


def update(state: Divergence, loss: jax.Array, t: jax.Array, spike_factor: float) -> Divergence:
    """The state after step t with training loss `loss`."""
    full = jnp.all(jnp.isfinite(state.window))
    median = jnp.median(state.window)
    blowup = (state.start > 0) & (loss > spike_factor * state.start)  # a loss <= 0: no scale
    spike = (full & (loss > spike_factor * median)) | blowup
    bad = ~jnp.isfinite(loss)
    new_kind = jnp.where(bad, 1, jnp.where(spike, 2, 0)).astype(jnp.int32)
    first = (state.step < 0) & (new_kind > 0)
    step = jnp.where(first, t.astype(jnp.int32), state.step)
    kind = jnp.where(first, new_kind, state.kind)
    window = jnp.roll(state.window, -1).at[-1].set(loss)
    start = jnp.where(jnp.isnan(state.start), loss.astype(jnp.float32), state.start)
    return Divergence(window, step, kind, start)
