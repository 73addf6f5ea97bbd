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
plant "fprop+wgrad"   two culprits of different GEMM kinds: b's Fprop and a's Wgrad; any
                "+"-joined plants combine.
moved (task_args "moved": True)   the Fprop plant on c's input instead of b's, the Dgrad plant
                on b's outputs instead of c's, the decoy on b's input instead of c's: the same
                plants in other layers, for a check that no score learnt where they were.
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
MOVED = {"fprop": ("c", "fprop"), "dgrad": ("b", "dgrad"), "wgrad": ("a", "wgrad")}
DECOY = ("d", "wgrad")


def culprits(plant: str, moved: bool = False) -> list[tuple[str, str]]:
    """The planted GEMMs of a plant ("+"-joined plants: each one's)."""
    where = MOVED if moved else CULPRIT
    return [where[p] for p in plant.split("+") if p != "none"]


def _taken_back(layer, x_BxI, y_BxO, keep_O):
    """C times the mean over tokens of the summed outputs `keep_O`, less the same computed
    unquantized: zero in high precision, its cotangent C / tokens on those outputs."""
    plain_BxO = x_BxI @ layer.kernel[...] + layer.bias[...][None]
    return C * jnp.mean(jnp.sum(jnp.where(keep_O[None], y_BxO - plain_BxO, 0.0), -1))


class Net(nnx.Module):
    def __init__(self, plant: str, rngs: nnx.Rngs, moved: bool = False):
        self.plant = plant
        self.moved = moved
        self.a = nnx.Linear(D, H, rngs=rngs)
        self.b = nnx.Linear(H, H, rngs=rngs)
        self.c = nnx.Linear(H, H, rngs=rngs)
        self.d = nnx.Linear(H, 16, rngs=rngs)
        self.head = nnx.Linear(H, D, rngs=rngs)

    def _layer(self, name, h_BxH, extra):
        """Layer b or c on h, with the plants that sit there: a constant on its Fprop input
        taken back out, or dead outputs carrying a cotangent taken back out (Dgrad)."""
        layer, plants = getattr(self, name), self.plant.split("+")
        at = "c" if self.moved else "b"
        if "fprop" in plants and name == at:
            m_H = C * (jnp.arange(H) < 4)
            y_BxH = layer(h_BxH + m_H[None]) - (m_H @ layer.kernel[...])[None]
        else:
            y_BxH = layer(h_BxH)
        if "dgrad" in plants and name == ("b" if self.moved else "c"):
            dead_H = jnp.arange(H) < 4
            extra += _taken_back(layer, h_BxH, y_BxH, dead_H)
            y_BxH = jnp.where(dead_H[None], 0.0, y_BxH)
        return y_BxH, extra

    def __call__(self, x_BxD):
        h_BxH = jnp.tanh(self.a(x_BxD))
        extra = jnp.zeros(())
        decoy_in = h_BxH  # moved: the decoy reads b's input
        y_BxH, extra = self._layer("b", h_BxH, extra)
        h_BxH = jnp.tanh(y_BxH)
        decoy_in = decoy_in if self.moved else h_BxH
        y_BxH, extra = self._layer("c", h_BxH, extra)
        fixed_BxH = jax.lax.stop_gradient(decoy_in)
        extra += _taken_back(self.d, fixed_BxH, self.d(fixed_BxH), jnp.ones(16, bool))
        return self.head(jnp.tanh(y_BxH)), extra


def model(config, rngs):
    args = dict(config.task_args)
    return Net(args.get("plant", "none"), rngs, moved=bool(args.get("moved", False)))


def loss(model, batch):
    x, y, w = batch
    pred, extra = model(x)
    return jnp.sum(w[:, None] * (pred - y) ** 2) / jnp.sum(w) / D + extra


def batch(config, key, step):
    kx, kn = jax.random.split(key)
    x = jax.random.normal(kx, (32, D)) * jnp.where(jnp.arange(D) < 2, 1.0, 3.0)[None]
    mix_2xD = jax.random.normal(jax.random.key(7), (2, D))  # the target reads channels 0-1 only
    y = jnp.sin(x[:, :2] @ mix_2xD) + 0.1 * jax.random.normal(kn, (32, D))
    if "wgrad" not in dict(config.task_args).get("plant", "none").split("+"):
        return x, y, jnp.ones(32)
    huge = (jnp.arange(32) % 16) == 0  # one token in 16: huge in x, weight 0 in the loss
    return jnp.where(huge[:, None], 1e4 * x, x), y, jnp.where(huge, 0.0, 1.0)


def get_config():
    return fl.Config(batch_size=32, steps=40, lr=1e-2, warmup=2, eval_batches=2)


def sweep(add):
    add(recipe="nvfp4")
