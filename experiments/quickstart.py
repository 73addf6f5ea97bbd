"""Quickstart: a Llama-style LM on a synthetic Markov language, four precision recipes, 4 seeds.

    fp4lab run experiments/quickstart.py --workers 2

Compilation dominates at this size (a quantized cell compiles in about a minute on a CPU), so
the LM has one block and `--workers 2` compiles two cells at a time. The language is a seeded
sparse Markov chain whose entropy rate is computed exactly, so every
run reports its loss gap to the true floor. The recipes: BF16 (the baseline), NVFP4 (NVIDIA
2025, arXiv 2509.25149), MXFP4 (OCP MX, E8M0 scales) and NVFP4 with the weight-gradient GEMM in
BF16 (the GEMM Cim et al. 2026 find most sensitive). The LM head stays in BF16 in every recipe,
as NVIDIA's recipe keeps the last layers in high precision. Telemetry records the operand
errors of every GEMM every 25 steps; the gradient-flow heatmap shows where the error enters.

Measured (one block, 4 seeds, 95 % intervals): loss gap BF16 0.035 [0.029, 0.045], NVFP4
0.044 [0.037, 0.052], MXFP4 0.047 [0.042, 0.055], NVFP4 with Wgrad in BF16 0.043 [0.035, 0.052];
tokens to a 0.1-nat gap +25 to +27 % over BF16 for every FP4 recipe; no divergences; two
blocks gave the same ordering. Time on an idle 2-core machine, README command (A) from a fresh
clone, venv and install included: 3m17s-3m39s wall (the sweep 1m52s-2m15s).
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
        n_layers=1,
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
    add(recipe="mxfp4")
    add("recipe=nvfp4,wgrad=bf16", recipe="nvfp4", gemms={"wgrad": "bf16"})
