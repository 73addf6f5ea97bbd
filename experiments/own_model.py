"""Your own model, loss and data: a pre-norm Transformer of plain nnx layers on a noisy counter.

    fp4lab run experiments/own_model.py --telemetry 25
    fp4lab show results/own_model

Nothing here comes from fp4lab's models or tasks: the file defines `model(config, rngs)`,
`loss(model, batch)` and `batch(key, step)` (the contract of `fp4lab.train.own`), and fp4lab
quantizes the model's nnx.Linear and nnx.MultiHeadAttention GEMMs under each cell's recipe.
The data: sequences over V tokens where each next token is the previous one plus one (mod V)
with probability 1 - P, else uniform, so the best possible loss is the entropy rate below
(`FLOOR`), and every run reports its gap to it. Seeds: init draws the weights, data the
sequences, quant the stochastic rounding.
"""

import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import fp4lab as fl

V, T, P = 32, 32, 0.2  # vocabulary, sequence length, chance of a uniform next token
_q = 1 - P + P / V  # the chance of the likely next token
FLOOR = -(_q * math.log(_q) + (V - 1) * (P / V) * math.log(P / V))  # nats per token
SEEDS = 3
TOKENS_PER_STEP = lambda config: config.batch_size * T  # noqa: E731


class Block(nnx.Module):
    def __init__(self, d: int, heads: int, rngs: nnx.Rngs):
        self.norm1 = nnx.RMSNorm(d, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(heads, d, use_bias=False, decode=False, rngs=rngs)
        self.norm2 = nnx.RMSNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, 4 * d, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(4 * d, d, use_bias=False, rngs=rngs)

    def __call__(self, x_BxTxD, mask):
        x_BxTxD = x_BxTxD + self.attn(self.norm1(x_BxTxD), mask=mask)
        return x_BxTxD + self.down(jax.nn.gelu(self.up(self.norm2(x_BxTxD))))


class CounterLM(nnx.Module):
    def __init__(self, d: int, layers: int, heads: int, rngs: nnx.Rngs):
        self.embed = nnx.Embed(V, d, rngs=rngs)
        self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (T, d)))
        self.blocks = nnx.List([Block(d, heads, rngs) for _ in range(layers)])
        self.norm = nnx.RMSNorm(d, rngs=rngs)
        self.head = nnx.Linear(d, V, use_bias=False, rngs=rngs)

    def __call__(self, tokens_BxT):
        x_BxTxD = self.embed(tokens_BxT) + self.pos[: tokens_BxT.shape[1]]
        mask = nnx.make_causal_mask(tokens_BxT)
        for block in self.blocks:
            x_BxTxD = block(x_BxTxD, mask)
        return self.head(self.norm(x_BxTxD))


def model(config, rngs):
    return CounterLM(config.d_model, config.n_layers, config.n_heads, rngs)


def loss(model, tokens_BxT1):
    logits_BxTxV = model(tokens_BxT1[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, tokens_BxT1[:, 1:]).mean()


def batch(config, key, step):
    first, jump, noise = jax.random.split(key, 3)
    B = config.batch_size
    x0_B = jax.random.randint(first, (B,), 0, V)
    uniform_BxT = jax.random.randint(noise, (B, T), 0, V)
    jumps_BxT = jax.random.bernoulli(jump, P, (B, T))

    def next_token(x_B, inputs):
        jumped_B, u_B = inputs
        x_B = jnp.where(jumped_B, u_B, (x_B + 1) % V)
        return x_B, x_B

    _, rest_TxB = jax.lax.scan(next_token, x0_B, (jumps_BxT.T, uniform_BxT.T))
    return jnp.concatenate([x0_B[:, None], rest_TxB.T], axis=1)  # (B, T + 1)


def get_config():
    return fl.Config(
        d_model=32, n_layers=2, n_heads=4, batch_size=16, steps=150, lr=3e-3, warmup=10,
        rules=((r"head", "bf16"),), eval_batches=4, target_gap=0.2,
    )  # fmt: skip


def sweep(add):
    add(recipe="bf16")
    add(recipe="nvfp4")
