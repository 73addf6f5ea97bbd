"""Quickstart: a Llama-style LM on a synthetic Markov language, four precision recipes, 4 seeds.

    fp4lab run experiments/quickstart.py --workers 2

The LM has two blocks under a scan (`scan_layers=True`: the blocks compile once, and rules and
telemetry still see each block's layers by name), and `--workers 2` computes two cells at a
time. The language is a seeded sparse Markov chain whose entropy rate is computed exactly, so
every run reports its loss gap to the true floor. The recipes: BF16 (the baseline), NVFP4
(NVIDIA 2025, arXiv 2509.25149: stochastic rounding on the gradients, a random Hadamard on
Wgrad), NVFP4-RL (the "4-bitter lesson" recipe of humans& 2026: round to nearest,
four-over-six, per-row activation scales, a backward on the dequantized operands) and NVFP4
with the weight-gradient GEMM in BF16 (the GEMM Cim et al. 2026 find most sensitive). The LM
head stays in BF16 in every recipe, as NVIDIA's recipe keeps the last layers in high
precision. Telemetry records the operand errors of every GEMM every 25 steps; the
gradient-flow heatmaps show NVFP4's error per layer and operand against NVFP4-RL's.

Measured (4 seeds, 95 % intervals; a run on a loaded machine): loss gap BF16 0.034 [0.017,
0.052], NVFP4 0.040 [0.022, 0.059], NVFP4-RL 0.040 [0.024, 0.056], NVFP4 with Wgrad in BF16
0.039 [0.023, 0.055]; tokens to a 0.1-nat gap +23 % [+11, +35] over BF16 for NVFP4, +13 %
[-9, +36] for NVFP4-RL; no divergences. Four seeds separate the tokens-to-target overhead of
NVFP4 from 0, not the recipes' final gaps. On another kind of CPU the runs' last bits differ
and the numbers move within their intervals (an AVX-512 host: NVFP4 0.039 [0.021, 0.057],
NVFP4-RL 0.039 [0.019, 0.059]; +22 % [+8, +37] and +20 % [-5, +35]; an AMD EPYC host: NVFP4
0.038 [0.022, 0.053], NVFP4-RL 0.039 [0.024, 0.054]; +23 % [+2, +36] and +23 % [+11, +35]);
the conclusions stay.
"""

from fp4lab.train.config import Config

SEEDS = 4


def get_config():
    return Config(
        task="markov",
        vocab=64,
        order=1,
        branching=4,
        d_model=64,
        n_layers=2,
        scan_layers=True,
        n_heads=4,
        d_ff=128,
        seq_len=32,
        batch_size=16,
        steps=300,
        lr=3e-3,
        warmup=20,
        rules=((r"lm_head", "bf16"),),
        telemetry_every=25,
        eval_batches=8,
        target_gap=0.1,
    )


def sweep(add):
    add(recipe="bf16")
    add(recipe="nvfp4")
    add(recipe="nvfp4-rl")
    add("recipe=nvfp4,wgrad=bf16", recipe="nvfp4", gemms={"wgrad": "bf16"})
