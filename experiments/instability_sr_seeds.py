"""Cim et al.'s "SR and random-sign Hadamard do not converge" at the unstable lr, 8 fresh seeds.

    fp4lab run experiments/instability_sr_seeds.py --workers 2

Cim et al. 2026 (the AMD MXFP4 paper) report that MXFP4 training with stochastic rounding on
all three GEMMs, and with a random-sign Hadamard, does not converge at scale. On the proxy
experiments/instability_recipes_lr.py asked it at lr 0.3, where every precision spikes, on 3
seeds: both converged (0/3 ended in a spike, as MXFP4; BF16 2/3). Three seeds cannot tell a
share of 0 from one of 50 %. Here the same cells at lr 0.3 on seeds (i, i, i), i = 3-10, which
that study did not use: BF16, MXFP4, MXFP4 with a deterministic 16x16 Hadamard, with a
random-sign one and with SR on all three GEMMs. `analyze` writes rates.csv (runs that spike,
end in a spike (`diverged_at_end`: did not converge) or cross the in-run divergence rule, exact
intervals), contrasts.csv (each MXFP4 variant against MXFP4 on "diverged_at_end", Fisher's
exact test, Bonferroni over the four) and loss.csv (the capped mean final loss per cell,
t-intervals).
"""

import pandas as pd
from instability_common import proxy_config

from fp4lab.analysis import instability

SEEDS = [(i, i, i) for i in range(3, 11)]
LR = 0.3
CELLS = {
    "bf16": dict(recipe="bf16"),
    "mxfp4": dict(recipe="mxfp4"),
    "mxfp4-h16": dict(recipe="mxfp4-h16"),
    "mxfp4-h16-rs": dict(recipe="mxfp4-h16-rs"),
    "mxfp4-sr": dict(recipe="mxfp4-sr"),
}
VARIANTS = ("bf16", "mxfp4-h16", "mxfp4-h16-rs", "mxfp4-sr")


def get_config():
    return proxy_config(lr=LR)


def sweep(add):
    for label, overrides in CELLS.items():
        add(label, seeds=SEEDS, **overrides)


def analyze(results):
    runs = results.runs
    present = set(runs["cell"])
    pairs = [(v, "mxfp4") for v in VARIANTS if {v, "mxfp4"} <= present]
    rows = [
        instability.rate_contrast(runs, a, b, outcome="diverged_at_end", family=len(pairs))
        for a, b in pairs
    ]
    _, loss = instability.lr_sensitivity(runs, by="cell")
    return {
        "rates": instability.spike_rates(runs),
        "contrasts": pd.DataFrame(rows),
        "loss": loss,
    }
