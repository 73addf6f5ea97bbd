"""Su et al.'s other half on the proxy: the activations quantized, as well as the LayerNorm vectors.

    fp4lab run experiments/instability_outputs.py --workers 2

Su et al. 2025 ("Characterization and Mitigation of Training Instabilities in Microscaling
Formats", arXiv 2506.20752) trace MX training's loss spikes to the quantization of LayerNorm's
affine vectors "and a small share of activations". instability_proxy.py asks the first half
(`gemms={"norms": ...}`: 8/8 runs spike against BF16's 0/8). This file asks the second:
`gemms={"outputs": fl.mxfp4()}` rounds every GEMM's output to MXFP4 (E2M1, 32-blocks along the
features, E8M0 scales; straight-through gradient), the activations the element-wise ops read:
the GELU's input and each residual branch before the add, as microxcaling's emulation rounds a
linear layer's output (fp4lab rounds the GEMM's output before the layer adds its bias). The
cells put the outputs in MXFP4 under BF16 and MXFP4 GEMMs, alone and with the LayerNorm vectors,
and, with the vectors, in MXFP8 and BF16 (the dose), on the proxy of instability_proxy.py
(lr 0.1, 2000 steps, 8 seeds), beside that study's four cells (bf16, bf16+ln, mxfp4, mxfp4+ln:
the same configs, run again so that `fp4lab replicate` reruns every cell on fresh seeds).
`analyze` writes rates.csv, contrasts.csv (Fisher's exact test, Bonferroni; each "+out" cell
against its cell without, the FP4 GEMMs against BF16 GEMMs with the outputs quantized (does
the damping hold?), each dose against the vectors alone) and, while the series are there,
predict.csv. Measured: results/instability_outputs/ and the README.
"""

from instability_common import proxy_config, spike_tables

import fp4lab as fl

SEEDS = 8
LN = {"norms": fl.mxfp4()}  # the LayerNorm vectors in MXFP4
OUT = {"outputs": fl.mxfp4()}  # every GEMM's output in MXFP4
OUT8 = {"outputs": fl.mxfp8()}  # ... in MXFP8 (E4M3, 32-blocks, E8M0)
OUT16 = {"outputs": fl.cast_spec("bf16")}  # ... in BF16 (microxcaling's usual `bfloat`: 16)
CELLS = {
    "bf16": dict(recipe="bf16"),  # instability_proxy.py's four cells, the same configs
    "bf16+ln": dict(recipe="bf16", gemms=LN),
    "mxfp4": dict(recipe="mxfp4"),
    "mxfp4+ln": dict(recipe="mxfp4", gemms=LN),
    "bf16+out": dict(recipe="bf16", gemms=OUT),
    "mxfp4+out": dict(recipe="mxfp4", gemms=OUT),
    "bf16+ln+out": dict(recipe="bf16", gemms={**LN, **OUT}),
    "mxfp4+ln+out": dict(recipe="mxfp4", gemms={**LN, **OUT}),
    # the dose: the same vectors with the outputs rounded less
    "bf16+ln+out mxfp8": dict(recipe="bf16", gemms={**LN, **OUT8}),
    "bf16+ln+out bf16": dict(recipe="bf16", gemms={**LN, **OUT16}),
}
CONTRASTS = [
    ("bf16+out", "bf16"),
    ("mxfp4+out", "mxfp4"),
    ("bf16+ln+out", "bf16+ln"),
    ("mxfp4+ln+out", "mxfp4+ln"),
    ("mxfp4+out", "bf16+out"),
    ("mxfp4+ln+out", "bf16+ln+out"),
    ("bf16+ln+out mxfp8", "bf16+ln"),
    ("bf16+ln+out bf16", "bf16+ln"),
]


def get_config():
    return proxy_config()


def sweep(add):
    for label, overrides in CELLS.items():
        add(label, **overrides)


def analyze(results):
    return spike_tables(results, CONTRASTS)
