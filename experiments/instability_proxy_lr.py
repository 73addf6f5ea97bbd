"""Final loss against learning rate on Su et al.'s proxy, and Wortsman et al.'s LR sensitivity.

    fp4lab run experiments/instability_proxy.py --workers 2      # lr 0.1, 8 seeds
    fp4lab run experiments/instability_proxy_lr.py --workers 2   # lr 0.03 and 0.3

Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training instabilities",
arXiv 2309.14322) measure instability as the final loss over a log-spaced range of learning
rates, summarised as LR sensitivity (the mean excess over the best, each loss capped at the
initial loss: `fp4lab.analysis.instability.lr_sensitivity`). Lee et al. 2024 (arXiv 2405.18710)
ask whether reduced precision narrows the stable range. The proxy of
experiments/instability_proxy.py at two more learning rates, half a decade either side, 3 seeds
each; `analyze` joins the proxy study's lr-0.1 runs (its first 3 seeds) and writes rates.csv
(spike and divergence shares per cell), lr_loss.csv (capped mean final loss per precision and
lr, t-intervals), sensitivity.csv and figures/lr_loss.png."""

from pathlib import Path

import pandas as pd
from instability_common import lr_figure, proxy_config

import fp4lab as fl
from fp4lab.analysis import instability
from fp4lab.sweep.store import load

SEEDS = 3
LRS = (0.03, 0.3)
LN = {"norms": fl.mxfp4()}
PRECISIONS = {
    "bf16": dict(recipe="bf16"),
    "bf16+ln": dict(recipe="bf16", gemms=LN),
    "mxfp4": dict(recipe="mxfp4"),
    "mxfp4+ln": dict(recipe="mxfp4", gemms=LN),
}
AT_0_1 = (
    Path(__file__).resolve().parents[1] / "results" / "instability_proxy"
)  # the same cells at lr 0.1 (their first 3 seeds)


def get_config():
    return proxy_config()


def sweep(add):
    for lr in LRS:
        for name, overrides in PRECISIONS.items():
            add(f"{name} lr {lr}", lr=lr, **overrides)


def analyze(results):
    runs = results.runs.copy()
    runs["precision"] = runs["cell"].str.rsplit(" lr ", n=1).str[0]
    at = load(AT_0_1, metrics=False, cells=list(PRECISIONS)).runs
    at = at[at["seed_init"] < SEEDS].copy()
    at["precision"] = at["cell"]
    at["cell"] = at["cell"] + " lr 0.1"
    both = pd.concat([runs, at], ignore_index=True)
    table, per_lr = instability.lr_sensitivity(both, by="precision")
    rates = instability.spike_rates(both, by=("precision", "lr"))
    if len(results.metrics):  # drawn by the run; the committed folder keeps the records only
        path = results.path / "figures" / "lr_loss.png"
        lr_figure(per_lr, path, "proxy: final loss against learning rate")
    return {"rates": rates, "lr_loss": per_lr, "sensitivity": table}
