"""Lee et al.'s divergence share, asked with enough seeds: FP8 and BF16 on the proxy, 32 seeds.

    fp4lab run experiments/instability_fp8_seeds.py --workers 2

Lee et al. 2024 ("To FP8 and Back Again", arXiv 2405.18710) see FP8 training diverge in about
10 % of seeds under default settings. experiments/instability_proxy.py ran FP8 on 8 seeds at lr
0.1 (0/8 diverged or spiked, an interval up to 37 %: it cannot tell 10 % from 0). Here FP8
GEMMs and BF16 on the same proxy at lr 0.1 (where BF16 with quantized LayerNorm vectors spikes
in every run) and at lr 0.2 (between it and 0.3, where every precision spikes), on seeds (i, i,
i), i = 24-55, which no other proxy study used. `analyze` writes rates.csv (runs that spike,
end in a spike or cross the in-run divergence rule, exact intervals) and contrasts.csv (FP8
against BF16 at each lr, Fisher's exact test on "spiked" and on "diverged", Bonferroni over
the four).
"""

import pandas as pd
from instability_common import proxy_config

from fp4lab.analysis import instability

SEEDS = [(i, i, i) for i in range(24, 56)]
LRS = (0.1, 0.2)
PRECISIONS = {"bf16": dict(recipe="bf16"), "fp8": dict(recipe="fp8")}


def get_config():
    return proxy_config()


def sweep(add):
    for lr in LRS:
        for name, overrides in PRECISIONS.items():
            add(f"{name} lr {lr}", lr=lr, seeds=SEEDS, **overrides)


def analyze(results):
    runs = results.runs.copy()
    runs["precision"] = runs["cell"].str.rsplit(" lr ", n=1).str[0]
    rows = [  # Bonferroni over all four
        instability.rate_contrast(runs, f"fp8 lr {lr}", f"bf16 lr {lr}", outcome=o, family=4)
        for o in ("spiked", "diverged")
        for lr in LRS
    ]
    contrasts = pd.DataFrame(rows)
    return {"rates": instability.spike_rates(runs, by=("precision", "lr")), "contrasts": contrasts}
