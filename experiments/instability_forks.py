"""In-situ forks of the proxy's spiking runs: which change, made 50 steps before a spike,
averts it?

    fp4lab run experiments/instability_proxy.py --workers 2     # the parents first
    fp4lab run experiments/instability_forks.py --workers 2

Su et al. 2025 (arXiv 2506.20752) switch precision from a checkpoint shortly before a spike.
Here each run of the proxy's "bf16+ln" cell (BF16 GEMMs, LayerNorm vectors in MXFP4; 8 of 8
runs spike at lr 0.1) is forked 50 steps before its first spike event
(`fp4lab.sweep.forks`): the fork replays the parent's first steps bit for bit and changes one
thing from there on:

    same            nothing (the recipe draws no random numbers: the parent again, a control)
    norms hp        the LayerNorm vectors back to high precision
    gemms mxfp4     the GEMMs to MXFP4, the vectors still in MXFP4 (the "damping" cell)
    lr/2            half the learning rate

`analyze` writes forks.csv (every fork: its parent, the parent's event, the fork's first
spike at or after the fork) and averted.csv (per change: events averted, or delayed by more
than 20 steps, with exact intervals).
"""

from fp4lab.analysis import instability
from fp4lab.sweep import forks
from fp4lab.sweep.store import load
from fp4lab.train.config import Config

PARENT = "results/instability_proxy"
BEFORE = 50
DELAY = 20
CHANGES = {
    "same": {},
    "norms hp": {"gemms": {"norms": None}},
    "gemms mxfp4": {"recipe": "mxfp4", "gemms": {}},
    "lr/2": {"lr_scale": 0.5},
}


def get_config():
    return Config()  # every fork brings its parent's whole config


def sweep(add):
    forks.add_forks(add, PARENT, changes=CHANGES, before=BEFORE, cells=["bf16+ln"])


def analyze(results):
    parents = load(PARENT, metrics=False).runs.set_index("run_id")
    rows = []
    for run in results.runs.itertuples():
        change, parent = forks.parent_of(run.cell)
        event = int(parents.loc[parent, "first_spike"])
        step = event - BEFORE
        after = [s for s, _, _ in instability.parse_events(run.spike_events) if s >= step]
        rows.append(
            {
                "change": change,
                "parent": parent,
                "seed": run.seed_init,
                "event": event,
                "fork_step": step,
                "fork_first": float(after[0]) if after else float("nan"),
                "fork_events": len(after),
                "delay": DELAY,
                "parent_final": parents.loc[parent, "final_loss"],
                "final_loss": run.final_loss,
            }
        )
    import pandas as pd

    table = pd.DataFrame(rows).sort_values(["change", "seed"])
    return {"forks": table, "averted": instability.fork_outcomes(table)}
