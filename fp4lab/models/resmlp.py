"""A pre-LayerNorm residual MLP: the student of Su et al.'s instability proxy, in plain flax.nnx.

x_BxI -> embed (Linear I->D) -> n_blocks x [h + mlp(LayerNorm(h))] -> LayerNorm -> head (D->O)

with mlp = down(gelu(up(h))) or, for "swiglu", down(silu(gate(h)) * up(h)) (hidden width F).
Su et al. 2025 ("Characterization and Mitigation of Training Instabilities in Microscaling
Formats", arXiv 2506.20752) train this shape on Gaussian inputs against a fixed random teacher
with Adam and no clipping, and see the sharp loss spikes of MX-format LMs.

Paths: "embed", "blocks.0.norm", "blocks.0.mlp.up" (gate, down), "norm", "head".
Shape letters: B batch, I input, D width, F hidden, O output.
"""

from __future__ import annotations

import jax
from flax import nnx

__all__ = ["ResidualMLP", "ACTIVATIONS"]

ACTIVATIONS = ("gelu", "swiglu")


class _MLP(nnx.Module):
    def __init__(self, width: int, hidden: int, activation: str, *, rngs: nnx.Rngs):
        self.up = nnx.Linear(width, hidden, rngs=rngs)
        self.gate = nnx.Linear(width, hidden, rngs=rngs) if activation == "swiglu" else None
        self.down = nnx.Linear(hidden, width, rngs=rngs)

    def __call__(self, h_BxD: jax.Array) -> jax.Array:
        if self.gate is None:
            return self.down(jax.nn.gelu(self.up(h_BxD)))
        return self.down(jax.nn.silu(self.gate(h_BxD)) * self.up(h_BxD))


class _Block(nnx.Module):
    def __init__(self, width: int, hidden: int, activation: str, *, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.mlp = _MLP(width, hidden, activation, rngs=rngs)

    def __call__(self, h_BxD: jax.Array) -> jax.Array:
        return h_BxD + self.mlp(self.norm(h_BxD))


class ResidualMLP(nnx.Module):
    """`y_BxO = ResidualMLP(din, width, hidden, n_blocks, dout, rngs=rngs)(x_BxI)`.

    Args:
      din, dout: input and output widths.
      width: the residual stream's width D.
      hidden: the MLP's hidden width F.
      n_blocks: residual blocks.
      activation: "gelu" (down(gelu(up(h)))) or "swiglu" (down(silu(gate(h)) * up(h))).
      rngs: the nnx random streams used for initialization.
    """

    def __init__(
        self,
        din: int,
        width: int,
        hidden: int,
        n_blocks: int,
        dout: int,
        activation: str = "gelu",
        *,
        rngs: nnx.Rngs,
    ):
        if activation not in ACTIVATIONS:
            raise ValueError(f"ResidualMLP activation={activation!r}; allowed: {ACTIVATIONS}")
        for name, value in dict(din=din, width=width, hidden=hidden, dout=dout).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ResidualMLP {name}={value!r}; must be a positive int")
        self.embed = nnx.Linear(din, width, rngs=rngs)
        self.blocks = nnx.List(
            [_Block(width, hidden, activation, rngs=rngs) for _ in range(n_blocks)]
        )
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.head = nnx.Linear(width, dout, rngs=rngs)

    def __call__(self, x_BxI: jax.Array) -> jax.Array:
        h_BxD = self.embed(x_BxI)
        for block in self.blocks:
            h_BxD = block(h_BxD)
        return self.head(self.norm(h_BxD))
