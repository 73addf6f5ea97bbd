"""A tiny Llama-style decoder-only language model in plain flax.nnx.

tokens_BxT -> Embed -> n_layers x [x + Attn(RMSNorm(x)); x + SwiGLU(RMSNorm(x))] -> RMSNorm
-> lm_head -> logits_BxTxV (float32). With `qk_norm`, each head's queries and keys pass an
RMSNorm ("blocks.0.attn.q_norm", "k_norm") before RoPE (qk-layernorm, Wortsman et al. 2023).

Attention is causal multi-head self-attention with rotary position embeddings (RoPE, Su et al.
2021, arXiv 2104.09864) on queries and keys; the projections are nnx.LinearGeneral layers named
query/key/value/out, the scores and the weighted sum are jnp.einsum. The MLP is SwiGLU (Shazeer
2020, arXiv 2002.05202): down(silu(gate(x)) * up(x)), bias-free. The head is untied.

Paths: "embed", "blocks.0.attn_norm", "blocks.0.attn.query" (key, value, out),
"blocks.0.mlp_norm", "blocks.0.mlp.gate" (up, down), "norm", "lm_head".

With `scan_layers=True` the blocks are one Block whose parameters are stacked along a leading
layer axis (built with nnx.vmap) and applied with nnx.scan, as large JAX LM codebases do: the
compiled program holds one block, whatever the depth. Paths are then "blocks.attn.query" etc.
(the stacked module), and the same initial parameters as the unscanned model, stacked.

Shape letters: B batch, T sequence, D model width, N heads, H head width, F MLP width,
V vocabulary, K = H/2 rotary frequencies.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = [
    "TransformerConfig",
    "Transformer",
    "Block",
    "Attention",
    "SwiGLU",
    "rope",
    "logit_stats",
]

_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """Sizes and compute dtype of a Transformer (parameters are always float32)."""

    vocab: int  # number of token ids
    d_model: int = 64  # residual stream width D
    n_layers: int = 2  # number of blocks
    n_heads: int = 4  # attention heads N; D / N must be even (RoPE rotates pairs)
    d_ff: int = 256  # SwiGLU hidden width F
    max_len: int = 128  # longest sequence accepted
    dtype: str = "float32"  # computation dtype: "float32" | "bfloat16" | "float16"
    rope_base: float = 10_000.0  # RoPE wavelength base
    scan_layers: bool = False  # blocks as one stacked Block under nnx.scan (compile once)
    qk_norm: bool = False  # RMSNorm on each head's queries and keys before RoPE (qk-layernorm)

    def __post_init__(self):
        for name in ("vocab", "d_model", "n_layers", "n_heads", "d_ff", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TransformerConfig.{name}={value!r}; must be a positive int")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"TransformerConfig.d_model={self.d_model} with n_heads={self.n_heads}: d_model "
                "must be a multiple of n_heads with an even head width (RoPE rotates pairs)"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(f"TransformerConfig.dtype={self.dtype!r}; allowed: {_DTYPES}")
        if self.rope_base <= 1.0:
            raise ValueError(f"TransformerConfig.rope_base={self.rope_base}; must be > 1")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def rope(x_BxTxNxH: jax.Array, positions_T: jax.Array, base: float = 10_000.0) -> jax.Array:
    """Rotary position embedding: rotate pairs (x_i, x_{i+K}) by angle p * base^(-i/K).

    With K = H/2 and theta_i = base^(-i/K), position p maps
      (x1, x2) -> (x1 cos(p theta) - x2 sin(p theta), x2 cos(p theta) + x1 sin(p theta)),
    so <rope(q, m), rope(k, n)> depends on m - n only (Su et al. 2021, arXiv 2104.09864;
    "rotate half" layout as in Llama). Computed in float32, returned in x's dtype.

    Args:
      x_BxTxNxH: queries or keys; H even.
      positions_T: integer positions of the T tokens.
      base: wavelength base.
    Returns:
      The rotated array, same shape and dtype.
    """
    K = x_BxTxNxH.shape[-1] // 2
    theta_K = base ** (-jnp.arange(K, dtype=jnp.float32) / K)
    angle_TxK = positions_T.astype(jnp.float32)[:, None] * theta_K[None, :]
    sin_1xTx1xK = jnp.sin(angle_TxK)[None, :, None, :]
    cos_1xTx1xK = jnp.cos(angle_TxK)[None, :, None, :]
    x = x_BxTxNxH.astype(jnp.float32)
    x1, x2 = x[..., :K], x[..., K:]
    out = jnp.concatenate(
        [x1 * cos_1xTx1xK - x2 * sin_1xTx1xK, x2 * cos_1xTx1xK + x1 * sin_1xTx1xK], axis=-1
    )
    return out.astype(x_BxTxNxH.dtype)


class Attention(nnx.Module):
    """Causal multi-head self-attention with RoPE; softmax in float32."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        D, N, H = cfg.d_model, cfg.n_heads, cfg.head_dim
        kw = dict(use_bias=False, dtype=jnp.dtype(cfg.dtype), rngs=rngs)
        self.query = nnx.LinearGeneral(D, (N, H), **kw)
        self.key = nnx.LinearGeneral(D, (N, H), **kw)
        self.value = nnx.LinearGeneral(D, (N, H), **kw)
        self.out = nnx.LinearGeneral((N, H), D, axis=(-2, -1), **kw)
        self.rope_base = cfg.rope_base
        if cfg.qk_norm:  # Dehghani et al. 2023, Wortsman et al. 2023: bounds the logits' growth
            self.q_norm = nnx.RMSNorm(H, dtype=jnp.dtype(cfg.dtype), rngs=rngs)
            self.k_norm = nnx.RMSNorm(H, dtype=jnp.dtype(cfg.dtype), rngs=rngs)
        else:
            self.q_norm = self.k_norm = None

    def scores(self, x_BxTxD: jax.Array) -> jax.Array:
        """The attention logits q.k / sqrt(H) (float32), the positions a query may not see
        (later ones) set to float32's lowest value."""
        T = x_BxTxD.shape[1]
        positions_T = jnp.arange(T)
        q_BxTxNxH, k_BxTxNxH = self.query(x_BxTxD), self.key(x_BxTxD)
        if self.q_norm is not None:
            q_BxTxNxH, k_BxTxNxH = self.q_norm(q_BxTxNxH), self.k_norm(k_BxTxNxH)
        q_BxTxNxH = rope(q_BxTxNxH, positions_T, self.rope_base)
        k_BxTxNxH = rope(k_BxTxNxH, positions_T, self.rope_base)
        H = q_BxTxNxH.shape[-1]
        scores_BxNxTxT = jnp.einsum("btnh,bsnh->bnts", q_BxTxNxH, k_BxTxNxH)
        scores_BxNxTxT = scores_BxNxTxT.astype(jnp.float32) / jnp.sqrt(jnp.float32(H))
        causal_1x1xTxT = jnp.tril(jnp.ones((T, T), dtype=bool))[None, None, :, :]
        return jnp.where(causal_1x1xTxT, scores_BxNxTxT, jnp.finfo(jnp.float32).min)

    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        scores_BxNxTxT = self.scores(x_BxTxD)
        v_BxTxNxH = self.value(x_BxTxD)
        probs_BxNxTxT = jax.nn.softmax(scores_BxNxTxT, axis=-1).astype(v_BxTxNxH.dtype)
        o_BxTxNxH = jnp.einsum("bnts,bsnh->btnh", probs_BxNxTxT, v_BxTxNxH)
        return self.out(o_BxTxNxH)


class SwiGLU(nnx.Module):
    """down(silu(gate(x)) * up(x)), bias-free Linear layers."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        D, F = cfg.d_model, cfg.d_ff
        kw = dict(use_bias=False, dtype=jnp.dtype(cfg.dtype), rngs=rngs)
        self.gate = nnx.Linear(D, F, **kw)
        self.up = nnx.Linear(D, F, **kw)
        self.down = nnx.Linear(F, D, **kw)

    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        h_BxTxF = jax.nn.silu(self.gate(x_BxTxD)) * self.up(x_BxTxD)
        return self.down(h_BxTxF)


class Block(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        dtype = jnp.dtype(cfg.dtype)
        self.attn_norm = nnx.RMSNorm(cfg.d_model, dtype=dtype, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(cfg.d_model, dtype=dtype, rngs=rngs)
        self.mlp = SwiGLU(cfg, rngs=rngs)

    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        x_BxTxD = x_BxTxD + self.attn(self.attn_norm(x_BxTxD))
        return x_BxTxD + self.mlp(self.mlp_norm(x_BxTxD))

    def logit_max(self, x_BxTxD: jax.Array) -> jax.Array:
        """The largest attention logit this block computes on input x (a query's own position
        is always visible, so the masked entries never win)."""
        return jnp.max(self.attn.scores(self.attn_norm(x_BxTxD)))


class Transformer(nnx.Module):
    """Decoder-only LM: `logits_BxTxV = Transformer(cfg, rngs=rngs)(tokens_BxT)`.

    Args:
      config: a TransformerConfig.
      rngs: the nnx random streams used for initialization.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        dtype = jnp.dtype(config.dtype)
        self.config = config
        self.embed = nnx.Embed(config.vocab, config.d_model, dtype=dtype, rngs=rngs)
        if config.scan_layers:
            self.blocks = _stacked_blocks(config, rngs)
        else:
            self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.n_layers)])
        self.norm = nnx.RMSNorm(config.d_model, dtype=dtype, rngs=rngs)
        self.lm_head = nnx.Linear(
            config.d_model, config.vocab, use_bias=False, dtype=dtype, rngs=rngs
        )

    def __call__(self, tokens_BxT: jax.Array) -> jax.Array:
        """Next-token logits for every position (float32), causal: position t sees tokens <= t."""
        if tokens_BxT.ndim != 2:
            raise ValueError(f"tokens must have shape (batch, length), got {tokens_BxT.shape}")
        if tokens_BxT.shape[1] > self.config.max_len:
            raise ValueError(
                f"sequence length {tokens_BxT.shape[1]} exceeds max_len={self.config.max_len}"
            )
        x_BxTxD = self.embed(tokens_BxT)
        if self.config.scan_layers:
            x_BxTxD = _scan_blocks(x_BxTxD, self.blocks)
        else:
            for block in self.blocks:
                x_BxTxD = block(x_BxTxD)
        logits_BxTxV = self.lm_head(self.norm(x_BxTxD))
        return logits_BxTxV.astype(jnp.float32)


def logit_stats(model: Transformer, tokens_BxT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(logits, the largest attention logit of every block, (n_layers,)) of `model` on tokens:
    Wortsman et al. 2023's attention-logit growth, read beside the forward. The forward is
    `Transformer.__call__`'s, block by block, with each block's attention logits computed a
    second time from the block's input (`Block.logit_max`)."""
    x_BxTxD = model.embed(tokens_BxT)
    if model.config.scan_layers:
        x_BxTxD, maxima_L = _scan_blocks_with_max(x_BxTxD, model.blocks)
    else:
        maxima = []
        for block in model.blocks:
            maxima.append(block.logit_max(x_BxTxD))
            x_BxTxD = block(x_BxTxD)
        maxima_L = jnp.stack(maxima)
    logits_BxTxV = model.lm_head(model.norm(x_BxTxD)).astype(jnp.float32)
    return logits_BxTxV, maxima_L


def _stacked_blocks(config: TransformerConfig, rngs: nnx.Rngs) -> Block:
    """One Block whose state is the n_layers Blocks of the unscanned model, stacked along a
    leading axis (the same draws from `rngs`, so both models start from the same parameters)."""
    blocks = [Block(config, rngs=rngs) for _ in range(config.n_layers)]
    graphdef, _ = nnx.split(blocks[0])
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *[nnx.state(b) for b in blocks])
    return nnx.merge(graphdef, stacked)


@nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
def _scan_blocks(x_BxTxD: jax.Array, block: Block) -> jax.Array:
    return block(x_BxTxD)


@nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
def _scan_blocks_with_max(x_BxTxD: jax.Array, block: Block) -> tuple[jax.Array, jax.Array]:
    return block(x_BxTxD), block.logit_max(x_BxTxD)
