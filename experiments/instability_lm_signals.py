"""Wortsman et al.'s two signals on the built-in LM: does the attention logit grow, and when?

    fp4lab run experiments/instability_lm_signals.py --workers 2

Wortsman et al. 2023 (arXiv 2309.14322) name two instabilities of large Transformers that small
ones show at high learning rates: attention-logit growth (the largest q.k / sqrt(H) grows until
the attention entropy collapses; qk-layernorm bounds it) and output-logit divergence (log Z of
the output logits drifts from 0; a z-loss holds it). experiments/instability_lm.py found the
4-block LM stable up to lr 0.7 and diverged in warm-up at lr 1.0 in every precision, qk-norm and
z-loss included, and could not say why: it recorded neither logit. Here the LMs' own signals
(`Config.signals`: attn_logit_max and logit_z, read from the high-precision model at each
step's weights, `fp4lab.train.signals`) beside the gradient norm and the update-to-weight ratio,
for BF16 and MXFP4, each plain and with qk-layernorm, and MXFP4 with a z-loss, at lr 0.3, 0.7
and 1.0 (3 seeds; 8 at 1.0), the LM study's configs and seeds (its runs again, with the new
series; bf16 with qk-norm is new). `analyze` writes rates.csv (spike and divergence shares,
exact intervals), growth.csv (`instability.signal_growth`: each signal at step 0 and at its peak
before the first event, t-intervals over runs, and the peak over the start) and predict.csv
(which signal rises before the events, AUC and lead time, over the runs with one), and
figures/logits.png (the two logits per step, each cell's median over its seeds).
"""

from instability_common import lm_config

from fp4lab.analysis import instability

SEEDS = 3
LRS = (0.3, 0.7, 1.0)
SEEDS_AT = {1.0: 8}
PRECISIONS = {
    "bf16": dict(recipe="bf16"),
    "bf16 qk-norm": dict(recipe="bf16", qk_norm=True),
    "mxfp4": dict(recipe="mxfp4"),
    "mxfp4 qk-norm": dict(recipe="mxfp4", qk_norm=True),
    "mxfp4 z-loss": dict(recipe="mxfp4", z_loss=1e-4),
}
SIGNALS = ("attn_logit_max", "logit_z", "grad_norm", "update_ratio")


def get_config():
    return lm_config()


def sweep(add):
    for lr in LRS:
        for name, overrides in PRECISIONS.items():
            add(f"{name} lr {lr}", lr=lr, seeds=SEEDS_AT.get(lr), **overrides)


def analyze(results):
    runs = results.runs.copy()
    runs["precision"] = runs["cell"].str.rsplit(" lr ", n=1).str[0]
    by = ("precision", "lr")
    tables = {"rates": instability.spike_rates(runs, by=by)}
    if len(results.metrics):  # the committed folder keeps its series: these recompute
        tables["growth"] = instability.signal_growth(results.metrics, runs, SIGNALS, by=by)
        eventful = runs[runs["spikes"] > 0]
        tables["predict"] = instability.predictive(results.metrics, eventful, SIGNALS)
        _figure(results.metrics, runs, results.path / "figures" / "logits.png")
    return tables


def _figure(metrics, runs, path):
    """The two logits per step, the median over a cell's seeds, one panel per lr."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    wide = metrics[metrics["metric"].isin(SIGNALS[:2])].merge(
        runs[["run_id", "precision", "lr"]], on="run_id"
    )
    fig, axes = plt.subplots(2, len(LRS), figsize=(4 * len(LRS), 6), sharex=True)
    for row, signal in enumerate(SIGNALS[:2]):
        for col, lr in enumerate(LRS):
            ax = axes[row, col]
            at = wide[(wide["metric"] == signal) & (wide["lr"] == lr)]
            for i, name in enumerate(PRECISIONS):  # one colour per precision in every panel
                median = at[at["precision"] == name].groupby("step")["value"].median()
                ax.plot(median.index, median.to_numpy(), color=f"C{i}", label=name)
            ax.set(yscale="log", title=f"{signal}, lr {lr}", xlabel="step" if row else None)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
