"""The proxy's three key cells, to replicate on fresh seeds: spikes from MXFP4 LayerNorm
vectors, and their damping by MXFP4 GEMMs.

    fp4lab run experiments/instability_proxy_key.py --workers 2
    fp4lab replicate results/instability_proxy_key --seeds-from 8

The cells "bf16", "bf16+ln" and "mxfp4+ln" of experiments/instability_proxy.py, with its base
config (the same runs, the same run ids: results/instability_proxy_key holds those runs of
seeds 0-7), and its two words: "bf16+ln" spikes more often than "bf16" (8/8 against 0/8),
"mxfp4+ln" less often than "bf16+ln" (1/8 against 8/8). `fp4lab replicate` re-runs them on
seeds 8-15 and writes words.csv.
"""

from fp4lab.analysis import instability
from fp4lab.sweep.experiment import load_experiment

_PROXY = load_experiment(__file__.replace("instability_proxy_key.py", "instability_proxy.py"))
SEEDS = 8
CELLS = ("bf16", "bf16+ln", "mxfp4+ln")
CONTRASTS = [("bf16+ln", "bf16"), ("mxfp4+ln", "bf16+ln")]


def get_config():
    return _PROXY.base


def sweep(add):
    for cell in _PROXY.cells:
        if cell.label in CELLS:
            add(cell.label, **cell.overrides)


def analyze(results):
    runs = results.runs
    return {
        "rates": instability.spike_rates(runs),
        "contrasts": instability.contrasts(runs, CONTRASTS, outcome="spiked"),
    }
