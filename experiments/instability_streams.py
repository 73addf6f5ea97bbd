"""Randomness or error, asked of an instability: is a spike tied to the quant stream?

    fp4lab run experiments/instability_streams.py --workers 2

On the proxy at lr 0.1 (experiments/instability_proxy.py), NVFP4 GEMMs with the LayerNorm
vectors in MXFP4 spike in about half the runs; NVFP4 rounds the gradients stochastically, so a
run's quant seed draws its noise. Each (init, data) pair i = 0..5 runs under quant seeds 0 and
1: if the same init and data spike under one quant seed and not another, the quant stream alone
decides there (an exact fact: nothing else differs and a run is deterministic); if the pair
fixes the outcome, init and data carry it (a permutation test,
`fp4lab.analysis.instability.stream_attribution`). (A recipe that draws nothing, as BF16 GEMMs
with MXFP4 vectors, is the other end: its quant seed changes no bit.) `analyze` writes
attribution.csv (binary: spiked; time to the first spike, censored at the run's 2000 steps) and
rates.csv."""

from instability_common import proxy_config

import fp4lab as fl
from fp4lab.analysis import instability

LN = {"norms": fl.mxfp4()}
STEPS = 2000


def get_config():
    return proxy_config(steps=STEPS)


def sweep(add):
    crossed = [(i, i, q) for i in range(6) for q in range(2)]
    add("nvfp4+ln", recipe="nvfp4", gemms=LN, seeds=crossed)


def analyze(results):
    import pandas as pd

    runs = results.runs
    binary = instability.stream_attribution(runs, outcome="spiked")
    timed = instability.stream_attribution(runs, outcome="first_spike", censor=STEPS)
    return {
        "attribution": pd.concat([binary, timed], ignore_index=True),
        "rates": instability.spike_rates(runs),
    }
