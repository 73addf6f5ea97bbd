"""Loss scaling as pure state-in / state-out functions (as jmp does).

The loss is multiplied by the scale before differentiation and the gradients divided by it
after, so small gradients survive narrow formats (Micikevicius et al. 2018, arXiv 1710.03740):

    none      scale 1
    static    a fixed scale
    dynamic   halve the scale (never below 1) and skip the update on a non-finite gradient;
              double it after `growth_interval` finite steps in a row
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["LossScale", "init", "scale_of", "unscale", "adjust"]


class LossScale(NamedTuple):
    scale: jax.Array  # float32, the current scale
    good: jax.Array  # int32, finite steps since the scale last changed


def init(scale: float) -> LossScale:
    return LossScale(jnp.float32(scale), jnp.int32(0))


def scale_of(state: LossScale, mode: str) -> jax.Array:
    """The factor the loss is multiplied by this step (1 without loss scaling)."""
    return state.scale if mode != "none" else jnp.float32(1.0)


def unscale(grads, state: LossScale, mode: str):
    """The gradients divided by this step's scale."""
    if mode == "none":
        return grads
    return jax.tree.map(lambda g: g / state.scale, grads)


def adjust(state: LossScale, finite: jax.Array, mode: str, growth_interval: int) -> LossScale:
    """The state after a step whose gradients were `finite` (only "dynamic" changes it)."""
    if mode != "dynamic":
        return state
    scale, good = state
    good = jnp.where(finite, good + 1, 0)
    grow = good >= growth_interval
    scale = jnp.where(finite, jnp.where(grow, scale * 2, scale), jnp.maximum(scale / 2, 1))
    good = jnp.where(grow, 0, good)
    return LossScale(scale, good)
