"""Planted models: a 4-layer MLP whose one GEMM hurts the loss under NVFP4 by construction, beside
a decoy GEMM whose large gradient error does not. An experiment file: `task_args` "plant"
chooses the culprit (a test or a benchmark reads this file with `fl.diagnose(experiment=...)`).

    x -> a -> tanh -> b -> tanh -> c -> tanh -> head -> prediction
                     decoy d on the same input as c, its gradient stopped: d(stop_gradient(.))

plant "fprop"   b's input carries a constant C on channels 0-3 that the model takes back out
                exactly, unquantized: y = b(h + C m) - (C m) @ W_b. High precision cancels it;
                FP4's 1x16 blocks of b's Fprop input do not: the other 12 channels of that
                block round to zero.
plant "dgrad"   c's outputs 0-3 feed nothing; the loss adds C times their mean sum over tokens
                and takes it back out exactly, unquantized. Their cotangent is C / tokens:
                FP4's 1x16 blocks of c's Dgrad input (dy, blocked along c's outputs) flush the
                real cotangents of outputs 4-15, so the layers below learn a wrong gradient.
plant "wgrad"   every 16th token of x is huge and has loss weight 0: FP4's blocks of a's Wgrad
                input (x, blocked along tokens) flush the real tokens beside them, so a's
                weights learn a wrong gradient. a's Fprop (blocked per token) is unharmed.
plant "none"    no culprit: only the decoy.
decoy (always)  d's outputs feed nothing; the loss adds C times their mean sum and takes it
                back out exactly, unquantized. d's weights' true gradient is zero, and d's
                Wgrad quantized gives them a large error (C times the rounding of d's inputs)
                that no loss under a high-precision forward sees.
"""

import jax
import jax.numpy as jnp
from flax import nnx

import fp4lab as fl

D, H, C = 16, 32, 100.0
PLANTS = ("fprop", "dgrad", "wgrad", "none")
CULPRIT = {"fprop": ("b", "fprop"), "dgrad": ("c", "dgrad"), "wgrad": ("a", "wgrad")}
DECOY = ("d", "wgrad")


def _taken_back(layer, x_BxI, y_BxO, keep_O):
    """C times the mean over tokens of the summed outputs `keep_O`, less the same computed
    unquantized: zero in high precision, its cotangent C / tokens on those outputs."""
    plain_BxO = x_BxI @ layer.kernel[...] + layer.bias[...][None]
    return C * jnp.mean(jnp.sum(jnp.where(keep_O[None], y_BxO - plain_BxO, 0.0), -1))


class Net(nnx.Module):
    def __init__(self, plant: str, rngs: nnx.Rngs):
        self.plant = plant
        self.a = nnx.Linear(D, H, rngs=rngs)
        self.b = nnx.Linear(H, H, rngs=rngs)
        self.c = nnx.Linear(H, H, rngs=rngs)
        self.d = nnx.Linear(H, 16, rngs=rngs)
        self.head = nnx.Linear(H, D, rngs=rngs)

    def __call__(self, x_BxD):
        h_BxH = jnp.tanh(self.a(x_BxD))
        if self.plant == "fprop":
            m_H = C * (jnp.arange(H) < 4)
            h_BxH = self.b(h_BxH + m_H[None]) - (m_H @ self.b.kernel[...])[None]
        else:
            h_BxH = self.b(h_BxH)
        h_BxH = jnp.tanh(h_BxH)
        y_BxH = self.c(h_BxH)
        dead_H = (jnp.arange(H) < 4) & (self.plant == "dgrad")
        extra = _taken_back(self.c, h_BxH, y_BxH, dead_H)
        fixed_BxH = jax.lax.stop_gradient(h_BxH)
        extra += _taken_back(self.d, fixed_BxH, self.d(fixed_BxH), jnp.ones(16, bool))
        live_BxH = jnp.where(dead_H[None], 0.0, y_BxH)
        return self.head(jnp.tanh(live_BxH)), extra


def model(config, rngs):
    return Net(dict(config.task_args).get("plant", "none"), rngs)


def loss(model, batch):
    x, y, w = batch
    pred, extra = model(x)
    return jnp.sum(w[:, None] * (pred - y) ** 2) / jnp.sum(w) / D + extra


def batch(config, key, step):
    kx, kn = jax.random.split(key)
    x = jax.random.normal(kx, (32, D)) * jnp.where(jnp.arange(D) < 2, 1.0, 3.0)[None]
    mix_2xD = jax.random.normal(jax.random.key(7), (2, D))  # the target reads channels 0-1 only
    y = jnp.sin(x[:, :2] @ mix_2xD) + 0.1 * jax.random.normal(kn, (32, D))
    if dict(config.task_args).get("plant") != "wgrad":
        return x, y, jnp.ones(32)
    huge = (jnp.arange(32) % 16) == 0  # one token in 16: huge in x, weight 0 in the loss
    return jnp.where(huge[:, None], 1e4 * x, x), y, jnp.where(huge, 0.0, 1.0)


def get_config():
    return fl.Config(batch_size=32, steps=40, lr=1e-2, warmup=2, eval_batches=2)


def sweep(add):
    add(recipe="nvfp4")
