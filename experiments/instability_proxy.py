"""Instability on Su et al.'s proxy: which precision makes a residual MLP spike, at lr 0.1.

    fp4lab run experiments/instability_proxy.py --workers 2

Su et al. 2025 ("Characterization and Mitigation of Training Instabilities in Microscaling
Formats", arXiv 2506.20752) reproduce the loss spikes of MX-format LMs on a student-teacher
proxy: a pre-LayerNorm residual MLP (here 4 blocks, 64 wide, GELU MLPs 256 wide) regressing a
fixed random GELU teacher on Gaussian inputs, Adam, no gradient clipping, a constant learning
rate after warm-up. Their account: quantizing LayerNorm's affine vectors biases the gradient
multiplicatively. The cells put the GEMMs (BF16, FP8, MXFP4, NVFP4) and the LayerNorm vectors
(`gemms={"norms": fl.mxfp4()}`: "+ln") under each precision, and the remedies the papers name
on the spiking cell: Wgrad in BF16, a Hadamard (H16), stochastic rounding. A spike event is the
loss above twice the median of its last 20 (`fp4lab.train.spikes`); every run also records the
cheap per-step signals (`Config.signals`). `analyze` writes rates.csv (runs that spike, end in
a spike or diverge, exact intervals), contrasts.csv (Fisher's exact test against BF16, the
remedies against "mxfp4+ln", the FP4 GEMMs against "bf16+ln") and predict.csv (which per-step
signal rises before a spike: AUC for "an event within 50 steps" and lead time, over the runs
that spike; written while the runs' series are in the folder: the committed folder keeps the
records only, and `fl.sweep.reproduce` recomputes a run's series). Measured:
results/instability_proxy/ and the README.
"""

from instability_common import proxy_config, spike_tables

import fp4lab as fl

SEEDS = 8
LN = {"norms": fl.mxfp4()}  # the LayerNorm vectors in MXFP4 (E2M1, 32-blocks, E8M0)


def get_config():
    return proxy_config()


CELLS = {
    "bf16": dict(recipe="bf16"),
    "bf16+ln": dict(recipe="bf16", gemms=LN),
    "fp8": dict(recipe="fp8"),
    "mxfp4": dict(recipe="mxfp4"),
    "mxfp4+ln": dict(recipe="mxfp4", gemms=LN),
    "mxfp4+ln, wgrad bf16": dict(recipe="mxfp4", gemms={**LN, "wgrad": "bf16"}),
    "mxfp4-h16+ln": dict(recipe="mxfp4-h16", gemms=LN),
    "mxfp4-sr+ln": dict(recipe="mxfp4-sr", gemms=LN),
    "nvfp4": dict(recipe="nvfp4"),
    "nvfp4+ln": dict(recipe="nvfp4", gemms=LN),
}
CONTRASTS = [(c, "bf16") for c in CELLS if c != "bf16"]
CONTRASTS += [(c, "mxfp4+ln") for c in ("mxfp4+ln, wgrad bf16", "mxfp4-h16+ln", "mxfp4-sr+ln")]
CONTRASTS += [(c, "bf16+ln") for c in ("mxfp4+ln", "nvfp4+ln")]  # FP4 GEMMs damp the spikes?


def sweep(add):
    for label, overrides in CELLS.items():
        add(label, **overrides)


def analyze(results):
    return spike_tables(results, CONTRASTS)
