"""Fresh parents for the forks study, and the proxy's key contrasts again, on seeds 16-23.

    fp4lab run experiments/instability_forks_fresh_parents.py --workers 2
    fp4lab run experiments/instability_forks_fresh.py --workers 2

A fork replays its parent's first steps, and the event it is judged against is the parent's
first spike as the record holds it; that replay is the parent bit for bit only on the kind of
CPU the parent ran on. So the forks' replication on fresh seeds starts from parents run on the
machine that runs the forks: "bf16+ln" (BF16 GEMMs, LayerNorm vectors in MXFP4) and BF16 of
experiments/instability_proxy.py on seeds (i, i, i), i = 16-23, which no other proxy study
used. Beside them, the damping the proxy study found, on the same seeds: MXFP4 GEMMs with the
vectors in MXFP4 ("mxfp4+ln"), and only the forward GEMM in MXFP4 (experiments/
instability_damping.py's "mxfp4 fprop only+ln"). `analyze` writes rates.csv and contrasts.csv
(Fisher's exact test, Bonferroni over its 3 rows): the vectors' spikes against BF16, and each
damping cell against "bf16+ln", on these seeds and this machine, and predict.csv (which
per-step signal rises before a spike, as instability_proxy.py scores it; written while the
runs' series are in the folder, which the committed one, records only, no longer holds).
"""

from instability_common import proxy_config, spike_tables

import fp4lab as fl

SEEDS = [(i, i, i) for i in range(16, 24)]
LN = {"norms": fl.mxfp4()}
CELLS = {
    "bf16": dict(recipe="bf16"),
    "bf16+ln": dict(recipe="bf16", gemms=LN),
    "mxfp4+ln": dict(recipe="mxfp4", gemms=LN),
    "mxfp4 fprop only+ln": dict(recipe="mxfp4", gemms={**LN, "dgrad": "bf16", "wgrad": "bf16"}),
}
CONTRASTS = [("bf16+ln", "bf16"), ("mxfp4+ln", "bf16+ln"), ("mxfp4 fprop only+ln", "bf16+ln")]


def get_config():
    return proxy_config()


def sweep(add):
    for label, overrides in CELLS.items():
        add(label, seeds=SEEDS, **overrides)


def analyze(results):
    return spike_tables(results, CONTRASTS)
