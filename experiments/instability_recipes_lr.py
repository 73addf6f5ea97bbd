"""Every format and remedy against learning rate on Su et al.'s proxy, the unstable rates included.

    fp4lab run experiments/instability_recipes_lr.py --workers 2

experiments/instability_proxy_lr.py sweeps the learning rate for BF16 and MXFP4 (with and
without the LayerNorm vectors quantized). This file adds the other GEMM formats and the remedies
the papers name, on the same proxy and learning rates (0.03, 0.1, 0.3; 3 seeds each), with BF16
LayerNorm vectors: FP8, NVFP4, the "4-bitter" NVFP4 recipe (four-over-six, dequantized backward),
MXFP4 with Wgrad in BF16, with a deterministic 16x16 Hadamard, and the two variants that Cim et al.
2026 report do not converge at scale: stochastic rounding on all three GEMMs ("all three + SR")
and the random-sign Hadamard. lr 0.3 is where every precision tried so far spikes and most runs
cross the divergence rule: the setting where "does not converge" can show. FP8's and NVFP4's lr-0.1
runs are instability_proxy's first 3 seeds (the same configs); `analyze` joins them, and BF16's
and MXFP4's three learning rates from the two folders, and writes rates.csv (spike and divergence
shares per precision and lr, exact intervals), lr_loss.csv (capped mean final loss, t-intervals),
sensitivity.csv (Wortsman et al.'s LR sensitivity) and figures/lr_loss.png.
"""

from pathlib import Path

import pandas as pd
from instability_common import lr_figure, proxy_config

from fp4lab.analysis import instability
from fp4lab.sweep.store import load

SEEDS = 3
LRS = (0.03, 0.1, 0.3)
PRECISIONS = {
    "fp8": dict(recipe="fp8"),
    "nvfp4": dict(recipe="nvfp4"),
    "nvfp4-rl (4/6)": dict(recipe="nvfp4-rl"),
    "mxfp4, wgrad bf16": dict(recipe="mxfp4", gemms={"wgrad": "bf16"}),
    "mxfp4-h16": dict(recipe="mxfp4-h16"),
    "mxfp4-h16-rs": dict(recipe="mxfp4-h16-rs"),
    "mxfp4-sr": dict(recipe="mxfp4-sr"),
}
RESULTS = Path(__file__).resolve().parents[1] / "results"
AT_0_1 = ("fp8", "nvfp4")  # run at lr 0.1 by instability_proxy.py (its first 3 seeds)
REFERENCE = ("bf16", "mxfp4")  # instability_proxy_lr.py (0.03, 0.3) and instability_proxy.py (0.1)


def get_config():
    return proxy_config()


def sweep(add):
    for lr in LRS:
        for name, overrides in PRECISIONS.items():
            if not (lr == 0.1 and name in AT_0_1):
                add(f"{name} lr {lr}", lr=lr, **overrides)


def _committed(folder: str, cells: list[str]) -> pd.DataFrame:
    runs = load(RESULTS / folder, metrics=False, cells=cells).runs
    return runs[runs["seed_init"] < SEEDS].copy()


def analyze(results):
    runs = results.runs.copy()
    runs["precision"] = runs["cell"].str.rsplit(" lr ", n=1).str[0]
    at = _committed("instability_proxy", [*AT_0_1, *REFERENCE])
    at["precision"] = at["cell"]
    other = _committed(
        "instability_proxy_lr", [f"{p} lr {lr}" for p in REFERENCE for lr in LRS if lr != 0.1]
    )
    other["precision"] = other["cell"].str.rsplit(" lr ", n=1).str[0]
    both = pd.concat([at, other, runs], ignore_index=True)
    order = {p: i for i, p in enumerate([*REFERENCE, *PRECISIONS])}
    both = both.sort_values(
        ["precision", "lr"], key=lambda s: s.map(order).fillna(s), kind="stable"
    )
    table, per_lr = instability.lr_sensitivity(both, by="precision")
    rates = instability.spike_rates(both, by=("precision", "lr"))
    if len(results.metrics):  # drawn by the run; the committed folder keeps the records only
        path = results.path / "figures" / "lr_loss.png"
        title = "proxy: formats and remedies against learning rate (3 seeds)"
        lr_figure(per_lr, path, title, dashed=REFERENCE)
    return {"rates": rates, "lr_loss": per_lr, "sensitivity": table}
