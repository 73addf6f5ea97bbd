"""Which GEMMs of a 4-block LM should stay in BF16? `fp4lab diagnose` on a pre-norm Transformer
of plain nnx layers (the noisy counter of `own_model.py`), with and without outlier channels in
the residual stream.

    fp4lab diagnose experiments/diagnose_lm.py --verify --out results/diagnose_lm
    fp4lab diagnose experiments/diagnose_lm.py --set 'task_args={"outliers": 4}' --verify \
        --out results/diagnose_lm_outliers

`task_args` "outliers" (default 0): that many residual channels scaled by 30 at the embedding
(the massive activations of trained LMs, Sun et al. 2024, arXiv 2402.17762), so every block's
norm feeds its projections a few large channels.

Measured on two CPU cores (stage 1: 3 checkpoints x 3 batches x 3 quant seeds, 152 variants,
one compile; stage 2: 5 cells x 4 seeds x 150 steps), NVFP4 against BF16, budget 10 % of GEMM
FLOPs, score removed_grad_rel; last-blocks is the deepest whole layers within the share: the
head and block 3's attention out, value and key (`sets.csv`):

  no outliers   stage 1 134 s alone (199 s inside the verify run); stage 1 + verify 558 s.
                First: block 0's attention out, query, value, key and up Fprop, the head's Fprop
                and Dgrad; mean score Fprop 0.0078, Dgrad 0.0028, Wgrad 0.0005; by block
                0.132, 0.039, 0.039, 0.027 (block 3 last), head 0.042. Share of the NVFP4-to-
                BF16 gap on eval_hp closed (Fieller's interval over 4 paired seeds): top-k 67 %
                [42, 103] at 9.5 % of the FLOPs, random-k 18 % [-64, 77] at 9.5 %, last-blocks
                38 % [-8, 73] at 8.2 %. top-k - random-k eval_hp -0.0067 [-0.0116, -0.0017]
                ("lower"); top-k - last-blocks -0.0040 [-0.0117, +0.0037] ("no evidence").
  4 outliers    stage 1 164 s alone (184 s inside the verify run); stage 1 + verify 554 s.
                First: block 0's up Fprop, the head's Dgrad and Fprop, block 0's attention out
                Fprop; Fprop 0.0028, Dgrad 0.0014, Wgrad 0.0004. Gap closed: top-k 76 % [46,
                132], random-k -18 % [-138, 12], last-blocks 60 % [34, 112]. top-k - random-k
                -0.0079 [-0.0101, -0.0058] ("lower"); top-k - last-blocks -0.0014 [-0.0024,
                -0.0004] ("lower").

The published answers (the last blocks, NVIDIA 2025 Fig. 9; Wgrad, Cim et al. 2026) are not
what this model says: its first block and its head are the sensitive places, Wgrad the least
sensitive GEMM. The ranking beats random GEMMs at the same cost in both cases; it beats the
last layers with the outliers, and without them the difference is not resolved at 4 seeds.
Small-scale: a 32-wide, 4-block model, 150 steps, 4 seeds; the direction, not the size.
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
