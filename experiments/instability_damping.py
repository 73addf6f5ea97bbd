"""Why do MXFP4 GEMMs damp the spikes that MXFP4 LayerNorm vectors cause? One GEMM at a time.

    fp4lab run experiments/instability_damping.py --workers 2

On the proxy at lr 0.1 (experiments/instability_proxy.py) BF16 GEMMs with the LayerNorm
vectors in MXFP4 spike in 8 of 8 runs, MXFP4 GEMMs with the same vectors in 1 of 8. Three
accounts: (a) the quantized GEMMs make each Adam step smaller (a less effective step size:
then half the learning rate should damp as well, and the update-to-weight ratio should fall);
(b) their noise keeps the model off the edge (then stochastic rounding, more noise, should
damp more); (c) the forward's quantization acts on the activations the vectors scale (then
quantizing Fprop alone should damp, and the backward GEMMs alone should not). The cells:
BF16 GEMMs + MXFP4 vectors at lr 0.05 and 0.1 (a), and MXFP4 on one GEMM kind at a time with
the others in BF16 (c); (b) is the proxy's "mxfp4-sr+ln" cell, and all three GEMMs in MXFP4
its "mxfp4+ln" (1 of 8). `analyze` writes rates.csv,
contrasts.csv and updates.csv (each cell's median update-to-weight ratio over steps 100-800,
before most first spikes).
"""

from instability_common import proxy_config

import fp4lab as fl
from fp4lab.analysis import instability

SEEDS = 8
LN = {"norms": fl.mxfp4()}
BF16 = "bf16"


def get_config():
    return proxy_config()


CELLS = {
    "bf16+ln": dict(recipe="bf16", gemms=LN),
    "bf16+ln, lr 0.05": dict(recipe="bf16", gemms=LN, lr=0.05),
    "mxfp4 fprop only+ln": dict(recipe="mxfp4", gemms={**LN, "dgrad": BF16, "wgrad": BF16}),
    "mxfp4 dgrad only+ln": dict(recipe="mxfp4", gemms={**LN, "fprop": BF16, "wgrad": BF16}),
    "mxfp4 wgrad only+ln": dict(recipe="mxfp4", gemms={**LN, "fprop": BF16, "dgrad": BF16}),
}
CONTRASTS = [(c, "bf16+ln") for c in CELLS if c != "bf16+ln"]


def sweep(add):
    for label, overrides in CELLS.items():
        add(label, **overrides)


def analyze(results):
    runs = results.runs
    m = results.metrics
    m = m[(m["metric"] == "update_ratio") & m["step"].between(100, 800)]
    ratio = m.groupby("run_id")["value"].median().rename("update_ratio")
    per_run = runs.set_index("run_id").join(ratio)
    updates = per_run.groupby("cell", sort=False)["update_ratio"].agg(["median", "min", "max"])
    return {
        "rates": instability.spike_rates(runs),
        "contrasts": instability.contrasts(runs, CONTRASTS, outcome="spiked"),
        "updates": updates.reset_index(),
    }
