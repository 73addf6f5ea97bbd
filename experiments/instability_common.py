"""What the instability studies share (imported by the experiment files beside it; not a study).

`proxy_config` is Su et al. 2025's student-teacher proxy as every proxy study runs it (a
pre-LayerNorm residual MLP, 4 blocks, 64 wide, GELU MLPs 256 wide, regressing a fixed random
GELU teacher on Gaussian inputs; 128 examples a step, 2000 steps, Adam, a constant lr 0.1 after
100 warm-up steps, no clipping, the cheap per-step signals on), `lm_config` the LM studies'
4-block LM. `lr_figure` draws a study's `lr_loss` table: the capped final loss against learning
rate, one line per precision. `spike_tables` is a spike study's rates, contrasts and, while the
series are there, prediction.
"""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fp4lab.analysis import instability  # noqa: E402
from fp4lab.train.config import Config  # noqa: E402

SIGNALS = ("grad_norm", "update_ratio", "norm_max")  # the cheap per-step signals scored


def proxy_config(**changes) -> Config:
    base = Config(
        task="proxy",
        din=64,
        dout=64,
        teacher_hidden=(128, 128),
        d_model=64,
        d_ff=256,
        n_layers=4,
        batch_size=128,
        steps=2000,
        lr=0.1,
        clip_norm=0.0,
        warmup=100,
        schedule="constant",
        eval_batches=4,
        signals=True,
    )
    return base.replace(**changes) if changes else base


def lm_config(**changes) -> Config:
    """The 4-block LM of the LM instability studies (64 wide, 4 heads, SwiGLU 128 wide, a
    first-order Markov language of 64 tokens, 16 sequences of 64 tokens a step, 250 steps,
    Adam, 10 warm-up steps, no clipping, the per-step signals on)."""
    base = Config(
        task="markov",
        vocab=64,
        order=1,
        branching=4,
        d_model=64,
        n_layers=4,
        scan_layers=True,
        n_heads=4,
        d_ff=128,
        seq_len=64,
        batch_size=16,
        steps=250,
        warmup=10,
        clip_norm=0.0,
        eval_batches=4,
        signals=True,
    )
    return base.replace(**changes) if changes else base


def lr_figure(per_lr, path, title, *, log_loss=True, dashed=()):
    """per_lr: `fp4lab.analysis.instability.lr_sensitivity`'s second table (by "precision");
    `dashed`: precisions drawn dashed (those joined from other studies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, g in per_lr.groupby("precision", sort=False):
        ax.errorbar(
            g["lr"],
            g["loss"],
            yerr=[g["loss"] - g["lo"], g["hi"] - g["loss"]],
            marker="o",
            capsize=3,
            linestyle="--" if name in dashed else "-",
            label=name,
        )
    ax.set(
        xscale="log",
        yscale="log" if log_loss else "linear",
        xlabel="learning rate (Adam, no clipping)",
        ylabel="final loss (capped at the initial loss)",
        title=title,
    )
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def spike_tables(results, contrasts):
    """rates (per cell), contrasts (Fisher's exact test on "spiked" for each (a, b) of
    `contrasts` whose cells were run, Bonferroni over them) and, while the spiking runs'
    series are in the folder, predict (`instability.predictive` of `SIGNALS`: a committed
    folder, records only, has none)."""
    runs = results.runs
    present = set(runs["cell"])  # all of them, unless a subset was run
    pairs = [(a, b) for a, b in contrasts if {a, b} <= present]
    tables = {
        "rates": instability.spike_rates(runs),
        "contrasts": instability.contrasts(runs, pairs, outcome="spiked"),
    }
    spiking = runs[runs["spikes"] > 0]
    if set(spiking["run_id"]) <= set(results.metrics["run_id"]):  # the series are there
        tables["predict"] = instability.predictive(results.metrics, spiking, SIGNALS)
    return tables
