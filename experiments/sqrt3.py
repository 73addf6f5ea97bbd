"""The sqrt(3) gradient-to-noise threshold and a late high-precision phase: Chmiel et al. 2025
(arXiv 2505.19115), small.

    fp4lab run experiments/sqrt3.py --workers 1   (not yet run; about 10 min expected)

NOT YET PRODUCED: no results are committed for this file (see results/README.md).

The paper: quantized training stops making progress once the full-precision gradient norm falls
below about sqrt(3) times the quantization noise, ||g|| < sqrt(3) ||g_q - g||; a short
higher-precision phase at the end recovers it. NVIDIA 2025 (arXiv 2509.25149) adds that
switching the forward pass to BF16 late recovers most of the gap, switching the backward does
not. Here: a teacher-student MLP under NVFP4 with shadow gradients (`shadow=True`: the exact
gradient at the same parameters, every 25 steps), so the per-layer gradient-to-noise ratio
(`grad/<layer>/gnr`) is recorded over training; cells with the last 20 % of steps in BF16 for
the forward GEMM only, for the backward GEMMs only, and for everything.

Expect, if the claims carry over: gnr falling towards sqrt(3) as the loss plateaus; the late
forward switch lowering the final loss gap more than the late backward switch.
"""

from fp4lab.config import Config

SEEDS = 4


def get_config():
    return Config(
        task="teacher",
        din=64,
        dout=32,
        teacher_hidden=(64,),
        hidden=(128, 128),
        outlier_channels=4,
        batch_size=64,
        steps=1000,
        lr=3e-3,
        warmup=20,
        eval_batches=4,
        telemetry_every=25,
        shadow=True,
        recipe="nvfp4",
    )


def sweep(add):
    add("nvfp4")
    add("nvfp4, late fprop bf16", phases=((0.8, {"gemms": {"fprop": "bf16"}}),))
    add("nvfp4, late backward bf16", phases=((0.8, {"gemms": {"dgrad": "bf16", "wgrad": "bf16"}}),))
    add("nvfp4, late all bf16", phases=((0.8, "bf16"),))
    add(recipe="bf16")
