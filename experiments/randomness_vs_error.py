"""Randomness or error? One FP4 recipe pushed to a high learning rate, seeds varied stream by
stream, against recipe changes that lower the quantization error.

    fp4lab run experiments/randomness_vs_error.py --workers 1   (measured: 6 min on 2 CPU cores)

Question (the claim of Cim et al. 2026, arXiv 2605.09825): is FP4 training's extra loss driven
by randomness (stochastic rounding, random Hadamard signs, which the `quant` seed stream draws)
or by structured quantization error on sensitive GEMMs? Design: NVIDIA's NVFP4 recipe (arXiv
2509.25149: SR on gradients, random-sign Hadamard on Wgrad) on a teacher-student MLP with 4
outlier input channels at lr 3e-2, 10x the stable setting (a 4-seed probe ended near 0.19 against
FP8's 0.077 at 3e-3; nothing diverges in this MLP, so "destabilised" means a worse plateau).
Each cell runs the full 3 x 3 x 3 product of the init, data and quant seeds, so each stream's
share of the variance is estimated with the others held fixed. Cells: the recipe; the recipe
with the Wgrad GEMM in BF16; the "4-bitter lesson" NVFP4 recipe (nvfp4-rl: round to nearest,
four-over-six, per-row activation scales, backward on dequantized operands: less error and no
randomness at all); BF16 as the reference. Telemetry every 50 steps (the gradient-flow heatmap
notebook reads it).

Outcome: final loss gap (the optimum is 0). `analysis.verdict(runs, "loss_gap")` says which
factor matters. Expect, if the claim holds: the recipe factor with a large share, the quant
stream no larger than init or data.

What it gave (results/README.md): the cell takes 85 % [82, 87] of the variance of the loss
gap, the quant stream -0.1 % [-0.2, 0.5] (no evidence), init 2 % and data 4 %. Wgrad in BF16
did not lower NVFP4's gap (0.185 vs 0.186); nvfp4-rl did (0.162; BF16 0.144).
"""

from fp4lab import analysis
from fp4lab.train.config import Config

SEEDS = {"init": [0, 1, 2], "data": [0, 1, 2], "quant": [0, 1, 2]}


def get_config():
    return Config(
        task="teacher",
        din=64,
        dout=32,
        teacher_hidden=(64,),
        hidden=(128, 128),
        outlier_channels=4,
        outlier_scale=10.0,
        batch_size=64,
        steps=400,
        lr=3e-2,
        warmup=20,
        eval_batches=4,
        telemetry_every=50,
    )


def sweep(add):
    add(recipe="bf16")
    add(recipe="nvfp4")
    add("recipe=nvfp4,wgrad=bf16", recipe="nvfp4", gemms={"wgrad": "bf16"})
    add(recipe="nvfp4-rl")


def analyze(results):
    """verdict.csv: which factor (the cell or a seed stream) the loss gap depends on;
    loss_gap.csv: the gap per cell."""
    runs = results.runs
    verdict = analysis.verdict(runs, "loss_gap", ["cell"] + analysis.seed_factors(runs))
    return {"verdict": verdict, "loss_gap": analysis.loss_gap(runs)}
