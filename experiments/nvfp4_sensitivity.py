"""Which layers need BF16 under NVFP4: NVIDIA 2025 (arXiv 2509.25149), Fig. 9, small.

    fp4lab run experiments/nvfp4_sensitivity.py --workers 1   (not yet run; about 10 min expected)

NOT YET PRODUCED: no results are committed for this file (see results/README.md).

The paper (1.2B LM): all layers in NVFP4 diverges; the last 4 blocks in BF16 converges; the
first 4 in BF16 does not. Here: a 9-layer teacher-student MLP (hidden width 64, 4 outlier input
channels, lr 1e-2) under NVIDIA's NVFP4 recipe, with the first 3 or the last 3 linear layers in
BF16 (per-layer `rules`, first match wins), against all-NVFP4 and all-BF16. Outcome: final loss
gap and divergence rate over 8 seeds. Expect, if it carries over: last-3-in-BF16 closer to BF16
than first-3-in-BF16.

Figs. 10-11 (stochastic rounding on gradients vs activations vs weights; Hadamard on Wgrad vs
Fprop vs Dgrad) need recipe variants that are not named recipes yet; they are not covered here.
"""

from fp4lab.config import Config

SEEDS = 8


def get_config():
    return Config(
        task="teacher",
        din=64,
        dout=32,
        teacher_hidden=(64,),
        hidden=(64,) * 8,
        outlier_channels=4,
        batch_size=64,
        steps=600,
        lr=1e-2,
        warmup=20,
        eval_batches=4,
    )


def sweep(add):
    add(recipe="bf16")
    add(recipe="nvfp4")
    add("nvfp4, first 3 in bf16", recipe="nvfp4", rules=((r"layers\.[012]", "bf16"),))
    add("nvfp4, last 3 in bf16", recipe="nvfp4", rules=((r"layers\.[678]", "bf16"),))
