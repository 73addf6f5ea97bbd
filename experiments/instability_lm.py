"""Instability on the built-in LM: learning rates, precisions, and Wortsman et al.'s mitigations.

    fp4lab run experiments/instability_lm.py --workers 2

Wortsman et al. 2023 (arXiv 2309.14322) see large runs' instabilities (attention-logit growth,
output-logit divergence) in small Transformers at high learning rates, and mend them with
qk-layernorm and a z-loss. The 4-block LM of the other LM studies (64 wide, 1024 tokens a step,
250 steps, Adam, no gradient clipping, 3 seeds, 8 at lr 1.0) at lr 0.3, 0.5, 0.7 and 1.0, where
a pilot saw it go from stable (up to 0.3) to diverged (1.0): the two between look for a window
in which one precision diverges and another does not. Under BF16, MXFP4, and MXFP4 with
qk-layernorm (`qk_norm=True`) or a z-loss of 1e-4 (`z_loss`). `analyze` writes rates.csv (spike and
divergence shares per cell, exact intervals), contrasts.csv (each quantized cell against BF16
at its lr, Fisher's exact test, Bonferroni over all), lr_loss.csv, sensitivity.csv and
figures/lr_loss.png."""

from instability_common import lm_config, lr_figure

from fp4lab.analysis import instability

SEEDS = 3
LRS = (0.3, 0.5, 0.7, 1.0)
SEEDS_AT = {1.0: 8}  # where the FP4 cells spiked 3/3 and BF16 0/3: enough seeds for a word
PRECISIONS = {
    "bf16": dict(recipe="bf16"),
    "mxfp4": dict(recipe="mxfp4"),
    "mxfp4 qk-norm": dict(recipe="mxfp4", qk_norm=True),
    "mxfp4 z-loss": dict(recipe="mxfp4", z_loss=1e-4),
}


def get_config():
    return lm_config()


def sweep(add):
    for lr in LRS:
        for name, overrides in PRECISIONS.items():
            add(f"{name} lr {lr}", lr=lr, seeds=SEEDS_AT.get(lr), **overrides)


def analyze(results):
    runs = results.runs.copy()
    runs["precision"] = runs["cell"].str.rsplit(" lr ", n=1).str[0]
    cells = set(runs["cell"])  # all of them, unless a subset was run
    pairs = [(f"{p} lr {lr}", f"bf16 lr {lr}") for lr in LRS for p in PRECISIONS if p != "bf16"]
    pairs = [(a, b) for a, b in pairs if {a, b} <= cells]
    spiked = instability.contrasts(runs, pairs, outcome="spiked")
    diverged = instability.contrasts(runs, pairs, outcome="diverged_at_end")
    table, per_lr = instability.lr_sensitivity(runs, by="precision")
    if len(results.metrics):  # drawn by the run; the committed folder keeps the records only
        path = results.path / "figures" / "lr_loss.png"
        title = "4-block LM: final loss against learning rate"
        lr_figure(per_lr, path, title, log_loss=False)
    return {
        "rates": instability.spike_rates(runs, by=("precision", "lr")),
        "contrasts": spiked,
        "contrasts_diverged": diverged,
        "lr_loss": per_lr,
        "sensitivity": table,
    }
