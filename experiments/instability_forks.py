"""In-situ forks of the proxy's spiking runs: which change, made 50 steps before a spike,
averts it?

    fp4lab run experiments/instability_proxy.py --workers 2     # the parents first
    fp4lab run experiments/instability_forks.py --workers 2

Su et al. 2025 (arXiv 2506.20752) switch precision from a checkpoint shortly before a spike.
Here the runs of seeds 0-5 of the proxy's "bf16+ln" cell (BF16 GEMMs, LayerNorm vectors in
MXFP4; 8 of 8 runs spike at lr 0.1) are each forked 50 steps before its first spike event
(`fp4lab.sweep.forks`): the fork replays the parent's first steps bit for bit and changes one
thing from there on (a fork with no change is the parent again, bit for bit: the recipe draws no
random numbers; tests/sweep/test_forks.py checks it):

    norms hp        the LayerNorm vectors back to high precision
    gemms mxfp4     the GEMMs to MXFP4, the vectors still in MXFP4 (the "damping" cell)
    lr/2            half the learning rate

`analyze` writes forks.csv (every fork: its parent, the parent's event, the fork's first
spike at or after the fork) and averted.csv (per change: events averted, or delayed by more
than 20 steps, with exact intervals).
"""

from pathlib import Path

from fp4lab.analysis import instability
from fp4lab.sweep import forks
from fp4lab.sweep.store import load
from fp4lab.train.config import Config

PARENT = Path(__file__).resolve().parents[1] / "results" / "instability_proxy"
BEFORE = 50
DELAY = 20
FIRST = 6  # the runs of seeds 0-5 (each fork is a program of its own: about a minute each)
CHANGES = {
    "norms hp": {"gemms": {"norms": None}},
    "gemms mxfp4": {"recipe": "mxfp4", "gemms": {}},
    "lr/2": {"lr_scale": 0.5},
}


def get_config():
    return Config()  # every fork brings its parent's whole config


def sweep(add):
    forks.add_forks(add, PARENT, changes=CHANGES, before=BEFORE, cells=["bf16+ln"], first=FIRST)


def analyze(results, parent_folder=PARENT):
    """The tables (module docstring); `parent_folder`: the study whose runs were forked."""
    runs = load(parent_folder, metrics=False).runs
    parents = runs.set_index("run_id")
    rows, ids = [], {}  # ids: (change, parent) -> the fork's run id
    for run in results.runs.itertuples():
        seeds = (run.seed_init, run.seed_data, run.seed_quant)
        change, parent = forks.parent_of_run(run.cell, seeds, runs)
        ids[change, parent] = run.run_id
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
    tables = {"forks": table, "averted": instability.fork_outcomes(table)}
    if len(results.metrics):  # the figure needs the series (the committed folder: records)
        parent_series = load(parent_folder, metrics=["loss"], cells=["bf16+ln"]).metrics
        _figure(table, results, ids, parent_series, results.path / "figures" / "forks.png")
    return tables


def _figure(table, results, ids, parent_series, path):
    """The parent's and each fork's loss around the event, for the first four parents."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    loss = results.metrics[results.metrics["metric"] == "loss"]
    parents = list(dict.fromkeys(table["parent"]))[:4]
    fig, axes = plt.subplots(1, len(parents), figsize=(4 * len(parents), 3.2), squeeze=False)
    for ax, parent in zip(axes[0], parents, strict=True):
        rows = table[table["parent"] == parent]
        event = int(rows["event"].iloc[0])
        lo, hi = event - 2 * BEFORE, event + 6 * BEFORE
        p = parent_series[parent_series["run_id"] == parent]
        p = p[p["step"].between(lo, hi)]
        ax.plot(p["step"], p["value"], color="black", lw=1.5, label="parent")
        for change in rows["change"]:
            f = loss[loss["run_id"] == ids[change, parent]]
            f = f[f["step"].between(event - BEFORE, hi)]
            ax.plot(f["step"], f["value"], lw=1, alpha=0.8, label=change)
        ax.axvline(event - BEFORE, color="grey", ls=":", lw=1)
        ax.set(yscale="log", xlabel="step", title=f"seed {int(rows['seed'].iloc[0])}")
    axes[0][0].set_ylabel("training loss")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
