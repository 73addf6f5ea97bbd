"""Which blocks and which tensors NVFP4 is sensitive in, on the language model: NVIDIA 2025
(arXiv 2509.25149), Figs. 9-11, small.

    fp4lab run experiments/nvfp4_sensitivity_lm.py

The paper (a 1.2B LM): Fig. 9, all layers in NVFP4 diverges, the last 4 blocks in BF16
converges, the first 4 in BF16 does not; Fig. 10, stochastic rounding on the gradients helps, on
the activations or the weights hurts; Fig. 11, the 16x16 Hadamard on Wgrad helps, on Fprop or
Dgrad it hurts. `nvfp4_sensitivity.py` asked this of a 9-layer MLP whose outliers were injected
into its input, which favours the first layers by construction.

Here: the project's Llama-style LM with 8 pre-norm blocks under a scan (d_model 64, 4 heads,
d_ff 128; the LM head in BF16 in every cell, as in NVIDIA's recipe) on the Markov language of
order 2 (vocab 32, branching 4), Adam at 1e-2 with 20 warm-up steps, 200 steps of 16 x 64 =
1024 tokens, 8 seeds (init, data and quant streams equal: (i, i, i)), shared by every cell.
The setting is `randomness_vs_error_lm.py`'s with twice the blocks: there a pilot found NVFP4
measurably worse than BF16 at this rate (training loss over steps 150-199 +0.19 to +0.32 nats
in each of 4 seeds; its 4-block runs of 200 steps, +0.30 on the held-out gap), and this file
was written before any run of 8 blocks. Cells: BF16; NVFP4; NVFP4 with the first 2
or the last 2 of the 8 blocks in BF16 (25 %; per-layer rules, which act per block under the
scan); the recipe's named ablations, each differing from `nvfp4` in one place (Fig. 10:
`nvfp4-no-sr`, `-sr-acts`, `-sr-weights`; Fig. 11: `nvfp4-no-h`, `-h-fprop`, `-h-dgrad`). A
second group at 3e-2 (NVFP4, last 2 in BF16, BF16) looks for the divergence of Fig. 9.

Why this design can show what the MLP could not: the blocks are identical in width, nothing is
injected at the input, the Wgrad GEMM contracts over the 1024 tokens of a step (64 NVFP4
blocks), and the residual stream carries each block's error to the next.

Outcome: the final held-out loss gap under a high-precision forward (`loss_gap_hp`, the same
exact forward for every cell) as paired differences against NVFP4 on the shared seeds (the
verdict's fixed rows, Bonferroni over them), and the divergence rate per cell.

What it cannot show: the paper's magnitudes (1.2B parameters, 1T tokens); outliers in the
residual stream (the built-in LM has none).

Measured: 31m15s wall for the 104 runs, the two cores shared throughout with another sweep
(`randomness_vs_error_lm.py`'s second stage). What it gave (`paired.csv`, each against NVFP4
at its rate, Bonferroni over 9 rows at 1e-2 and 2 at 3e-2; 8 seeds; nothing diverged in any
cell, 0/8 each, Wilson [0 %, 32 %]):
- BF16 - NVFP4 -0.232 [-0.357, -0.107] nats: NVFP4 is worse here, as designed.
- Fig. 9: first 2 blocks in BF16 -0.100 [-0.245, +0.045], last 2 +0.021 [-0.074, +0.116]:
  neither resolved, and the point estimates favour the first blocks, not the paper's last.
- Fig. 10: no SR +0.119 [+0.001, +0.237] "higher" (SR on the gradients helps, as the paper
  says); SR also on the activations +0.100 [-0.015, +0.214] (not resolved); also on the
  weights +0.195 [+0.091, +0.299] "higher" (hurts, as the paper says).
- Fig. 11: no Hadamard +0.024 [-0.051, +0.099], also on Fprop +0.044 [-0.055, +0.143], also
  on Dgrad +0.046 [-0.042, +0.134]: none resolved.
- At 3e-2 nothing diverges either: BF16 - NVFP4 -0.093 [-0.202, +0.016], last 2 in BF16
  +0.031 [-0.067, +0.129]; the divergence of Fig. 9 is out of reach at this size and length.
"""

import pandas as pd

from fp4lab import analysis
from fp4lab.train.config import Config

SEEDS = 8
FIRST_2 = ((r"lm_head", "bf16"), (r"blocks\.[01]\..*", "bf16"))
LAST_2 = ((r"lm_head", "bf16"), (r"blocks\.[67]\..*", "bf16"))


def get_config():
    return Config(
        task="markov",
        vocab=32,
        order=2,
        branching=4,
        d_model=64,
        n_layers=8,
        scan_layers=True,
        n_heads=4,
        d_ff=128,
        seq_len=64,
        batch_size=16,
        steps=200,
        lr=1e-2,
        warmup=20,
        eval_batches=4,
        seed_batch=4,
        rules=((r"lm_head", "bf16"),),
        # the seed calls these committed results were computed with (fp4lab.sweep.compute)
        pad_seeds=True,
    )


def sweep(add):
    add("bf16", recipe="bf16")
    add("nvfp4", recipe="nvfp4")
    add("nvfp4, first 2 blocks in bf16", recipe="nvfp4", rules=FIRST_2)
    add("nvfp4, last 2 blocks in bf16", recipe="nvfp4", rules=LAST_2)
    for name in ("nvfp4-no-sr", "nvfp4-sr-acts", "nvfp4-sr-weights"):  # Fig. 10
        add(name, recipe=name)
    for name in ("nvfp4-no-h", "nvfp4-h-fprop", "nvfp4-h-dgrad"):  # Fig. 11
        add(name, recipe=name)
    add("bf16, lr 3e-2", recipe="bf16", lr=3e-2)  # Fig. 9's divergence, if it shows here
    add("nvfp4, lr 3e-2", recipe="nvfp4", lr=3e-2)
    add("nvfp4, last 2 blocks in bf16, lr 3e-2", recipe="nvfp4", rules=LAST_2, lr=3e-2)


def analyze(results):
    """paired.csv: each cell's loss_gap_hp against NVFP4 at its learning rate (the verdict's
    fixed rows: paired on the shared seeds, Bonferroni over the rows of each learning rate's
    verdict); diverged.csv: the
    divergence rate per cell (Wilson intervals)."""
    runs = results.runs
    low = runs[runs["lr"] == 1e-2]
    high = runs[runs["lr"] == 3e-2]
    rows = []
    for part, base in ((low, "nvfp4"), (high, "nvfp4, lr 3e-2")):
        v = analysis.verdict(part, "loss_gap_hp", baseline=base)
        rows.append(analysis.fixed_rows(v))
    return {
        "paired": pd.concat(rows, ignore_index=True),
        "diverged": analysis.with_family(analysis.divergence_rate(runs), 1),
    }
