"""Instability on the built-in LM: learning rates, precisions, and Wortsman et al.'s mitigations.

    fp4lab run experiments/instability_lm.py --workers 2

Wortsman et al. 2023 (arXiv 2309.14322) see large runs' instabilities (attention-logit growth,
output-logit divergence) in small Transformers at high learning rates, and mend them with
qk-layernorm and a z-loss. The 4-block LM of the other LM studies (64 wide, 1024 tokens a step,
250 steps, Adam, no gradient clipping, 3 seeds) at lr 0.3 and 1.0, where a pilot saw it go from
stable (up to 0.3) to diverged (1.0), under BF16, MXFP4, and MXFP4 with qk-layernorm
(`qk_norm=True`) or a z-loss of 1e-4 (`z_loss`). `analyze` writes rates.csv (spike and
divergence shares per cell, exact intervals), contrasts.csv (each quantized cell against BF16
at its lr, Fisher's exact test, Bonferroni over all), lr_loss.csv, sensitivity.csv and
figures/lr_loss.png."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fp4lab.analysis import instability  # noqa: E402
from fp4lab.train.config import Config  # noqa: E402

SEEDS = 3
LRS = (0.3, 1.0)
PRECISIONS = {
    "bf16": dict(recipe="bf16"),
    "mxfp4": dict(recipe="mxfp4"),
    "mxfp4 qk-norm": dict(recipe="mxfp4", qk_norm=True),
    "mxfp4 z-loss": dict(recipe="mxfp4", z_loss=1e-4),
}


def get_config():
    return Config(
        task="markov",
        vocab=64,
        order=1,
        branching=4,
        d_model=64,
        n_layers=4,
        scan_layers=True,
        n_heads=4,
        d_ff=128,
        seq_len=64,
        batch_size=16,
        steps=250,
        warmup=10,
        clip_norm=0.0,
        eval_batches=4,
        signals=True,
    )


def sweep(add):
    for lr in LRS:
        for name, overrides in PRECISIONS.items():
            add(f"{name} lr {lr}", lr=lr, **overrides)


def analyze(results):
    runs = results.runs.copy()
    runs["precision"] = runs["cell"].str.rsplit(" lr ", n=1).str[0]
    pairs = [(f"{p} lr {lr}", f"bf16 lr {lr}") for lr in LRS for p in PRECISIONS if p != "bf16"]
    spiked = instability.contrasts(runs, pairs, outcome="spiked")
    diverged = instability.contrasts(runs, pairs, outcome="diverged_at_end")
    table, per_lr = instability.lr_sensitivity(runs, by="precision")
    if len(results.metrics):  # drawn by the run; the committed folder keeps the records only
        _figure(per_lr, results.path / "figures" / "lr_loss.png")
    return {
        "rates": instability.spike_rates(runs, by=("precision", "lr")),
        "contrasts": spiked,
        "contrasts_diverged": diverged,
        "lr_loss": per_lr,
        "sensitivity": table,
    }


def _figure(per_lr, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, g in per_lr.groupby("precision", sort=False):
        ax.errorbar(
            g["lr"],
            g["loss"],
            yerr=[g["loss"] - g["lo"], g["hi"] - g["loss"]],
            marker="o",
            capsize=3,
            label=name,
        )
    ax.set(
        xscale="log",
        xlabel="learning rate (Adam, no clipping)",
        ylabel="final loss (capped at the initial loss)",
        title="4-block LM: final loss against learning rate",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
