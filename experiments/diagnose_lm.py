"""Which GEMMs of a 4-block LM should stay in BF16? `fp4lab diagnose` on a pre-norm Transformer
of plain nnx layers (the noisy counter of `own_model.py`), with and without outlier channels in
the residual stream.

    fp4lab diagnose experiments/diagnose_lm.py --time-budget none --verify --out results/diagnose_lm
    fp4lab diagnose experiments/diagnose_lm.py --set 'task_args={"outliers": 4}' \
        --time-budget none --verify --out results/diagnose_lm_outliers

`task_args` "outliers" (default 0): that many residual channels scaled by 30 at the embedding
(the massive activations of trained LMs, Sun et al. 2024, arXiv 2402.17762), so every block's
norm feeds its projections a few large channels.

Measured on two CPU cores under a load of 7 to 11 (other jobs; stage 1: 3 checkpoints x 3
batches x 3 quant seeds, 152 variants, one compile; stage 2: 7 cells x 4 seeds x 150 steps),
NVFP4 against BF16, budget 10 % of GEMM FLOPs, score alone_step_loss; random-k is 3 draws at
the nearest share; last-blocks the head and block 3's MLP down projection (`sets.csv`):

  no outliers   stage 1 292-370 s; stage 2 1138 s. Not decided: the first 3 (block 0's
                attention value Fprop, the head's Dgrad, block 0's up Fprop) cannot be told
                apart, and the scores disagree. Mean score Fprop 0.0031, Dgrad 0.0013, Wgrad
                0.0002; summed by block 0.067, 0.005, 0.015, 0.012 (block 3 last), head 0.017.
                The NVFP4-to-BF16 gap on eval_hp 0.0147 [0.0090, 0.0205], on eval_loss 0.013
                [0.007, 0.019]. Share closed (Fieller's interval, 4 paired seeds): top-k 45 %
                [30, 67] at 9.5 % of the FLOPs, random-k 28 % [5, 66] at 8.6 % (draws 24 to
                33 %), last-blocks 31 % [-8, 48] at 10.2 %. top-k - random-k eval_hp -0.0025
                [-0.0071, +0.0022], top-k - last-blocks -0.0021 [-0.0068, +0.0025]: "no
                evidence" both.
  4 outliers    stage 1 383 s; stage 2 471 s (fp4 and hp from an earlier call). Not decided:
                the first 5 (block 2's up, block 1's down, block 0's attention value Fprop,
                the head's Dgrad, block 3's up Fprop) cannot be told apart; the scores
                disagree. Gap 0.0092 [0.0034, 0.0149] on eval_hp, 0.0095 [0.0061, 0.0129] on
                eval_loss. Closed: top-k 35 % [-24, 64], random-k 1 % [-45, 13] (draws -19 to
                16 %), last-blocks 51 % [9, 111]. top-k - random-k -0.0032 [-0.0059, -0.0004]
                ("lower"); top-k - last-blocks +0.0015 [-0.0036, +0.0066] ("no evidence").

On this model no GEMM stands out as the planted ones do (docs/diagnose.md): the step-loss
scores are small (under 0.02 of a step's loss decrease each) and their first entries cannot be
told apart. The published answers (the last blocks, NVIDIA 2025 Fig. 9; Wgrad, Cim et al.
2026) are not what it says either: Fprop ranks highest, Wgrad lowest. The ranking beats random
GEMMs at equal cost with the outliers, not resolved without them; against the last layers
nothing is resolved at 4 seeds. An earlier default score (removed_grad_rel) closed 67 % [42,
103] and 76 % [46, 132] here; it ranks a planted decoy first. Small-scale: a 32-wide, 4-block
model, 150 steps, 4 seeds: the direction, not the size.
"""

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

import fp4lab as fl

# the task and the block of own_model.py, read from beside this file (its hash enters run ids)
DATA_FILES = ("own_model.py",)
_spec = importlib.util.spec_from_file_location("own_model", Path(__file__).with_name(DATA_FILES[0]))
_own = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_own)
V, T, FLOOR, TOKENS_PER_STEP = _own.V, _own.T, _own.FLOOR, _own.TOKENS_PER_STEP
Block, loss, batch = _own.Block, _own.loss, _own.batch


class CounterLM(nnx.Module):
    def __init__(self, d: int, layers: int, heads: int, outliers: int, rngs: nnx.Rngs):
        self.embed = nnx.Embed(V, d, rngs=rngs)
        self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (T, d)))
        self.outliers = outliers  # the first `outliers` residual channels, scaled by 30
        self.blocks = nnx.List([Block(d, heads, rngs) for _ in range(layers)])
        self.norm = nnx.RMSNorm(d, rngs=rngs)
        self.head = nnx.Linear(d, V, use_bias=False, rngs=rngs)

    def __call__(self, tokens_BxT):
        x_BxTxD = self.embed(tokens_BxT) + self.pos[: tokens_BxT.shape[1]]
        x_BxTxD = x_BxTxD * jnp.where(jnp.arange(x_BxTxD.shape[-1]) < self.outliers, 30.0, 1.0)
        mask = nnx.make_causal_mask(tokens_BxT)
        for block in self.blocks:
            x_BxTxD = block(x_BxTxD, mask)
        return self.head(self.norm(x_BxTxD))


def model(config, rngs):
    outliers = dict(config.task_args).get("outliers", 0)
    return CounterLM(config.d_model, config.n_layers, config.n_heads, outliers, rngs)


def get_config():
    return fl.Config(
        d_model=32, n_layers=4, n_heads=4, batch_size=16, steps=150, lr=3e-3, warmup=10,
        eval_batches=4,
        # the seed calls these committed results were computed with (fp4lab.sweep.compute)
        pad_seeds=True,
    )  # fmt: skip


def sweep(add):
    add(recipe="bf16")
    add(recipe="nvfp4")
