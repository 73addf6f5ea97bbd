"""An actor-critic for discrete actions: separate tanh torsos, as in PPO baselines.

Initialization follows the common PPO practice (Andrychowicz et al. 2021, "What matters in
on-policy RL"; purejaxrl's ppo.py): orthogonal kernels with gain sqrt(2) in the torsos, 0.01 on
the policy head and 1.0 on the value head, zero biases. Paths: "actor.layers.0", ...,
"critic.layers.2".
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

__all__ = ["ActorCritic", "Torso"]


class Torso(nnx.Module):
    """Linear -> tanh -> ... -> Linear with orthogonal initialization (gain per layer)."""

    def __init__(self, din: int, hidden: Sequence[int], dout: int, out_gain: float, *, rngs):
        widths = (din, *hidden, dout)
        n = len(widths) - 1
        ortho = nnx.initializers.orthogonal
        self.layers = nnx.List(
            [
                nnx.Linear(
                    widths[i],
                    widths[i + 1],
                    kernel_init=ortho(out_gain if i == n - 1 else np.sqrt(2.0)),
                    rngs=rngs,
                )
                for i in range(n)
            ]
        )

    def __call__(self, x_BxI: jax.Array) -> jax.Array:
        h = x_BxI
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = jnp.tanh(h)
        return h


class ActorCritic(nnx.Module):
    """Policy logits and state value from separate torsos.

    Args:
      obs_dim: width of a (flattened) observation.
      n_actions: number of discrete actions.
      hidden: hidden widths of each torso (an int w means (w, w)).
      rngs: the nnx random streams used for initialization.

    Call: `logits_BxA, value_B = model(obs_BxO)`.
    """

    def __init__(
        self, obs_dim: int, n_actions: int, hidden: Sequence[int] | int = (64, 64), *, rngs
    ):
        hidden = (hidden, hidden) if isinstance(hidden, int) else tuple(hidden)
        if obs_dim < 1 or n_actions < 1 or any(w < 1 for w in hidden):
            raise ValueError(
                f"ActorCritic sizes must be positive, got obs_dim={obs_dim}, "
                f"n_actions={n_actions}, hidden={hidden}"
            )
        self.actor = Torso(obs_dim, hidden, n_actions, out_gain=0.01, rngs=rngs)
        self.critic = Torso(obs_dim, hidden, 1, out_gain=1.0, rngs=rngs)

    def __call__(self, obs_BxO: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits_BxA = self.actor(obs_BxO)
        value_B = self.critic(obs_BxO)[..., 0]
        return logits_BxA, value_B
