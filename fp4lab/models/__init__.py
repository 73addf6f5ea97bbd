"""Small models written with plain flax.nnx layers, so quantizers plug in at flax's own seams.

None of these modules imports the rest of fp4lab: a quantizer that swaps flax's `dot_general`
is always exercised on unmodified model code. Module paths are the dotted nnx graph paths
("layers.0", "blocks.0.attn.query", "blocks.0.mlp.up", "lm_head", "actor.layers.2").
"""

from fp4lab.models.mlp import MLP
from fp4lab.models.policy import ActorCritic
from fp4lab.models.resmlp import ResidualMLP
from fp4lab.models.transformer import Attention, Block, SwiGLU, Transformer, TransformerConfig, rope

__all__ = [
    "MLP",
    "ActorCritic",
    "ResidualMLP",
    "Transformer",
    "TransformerConfig",
    "Block",
    "Attention",
    "SwiGLU",
    "rope",
]
