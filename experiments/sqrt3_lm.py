"""The sqrt(3) gradient-to-noise threshold and a late high-precision phase, on the language
model: Chmiel et al. 2025 (arXiv 2505.19115) and NVIDIA 2025 (arXiv 2509.25149), small.

    fp4lab run experiments/sqrt3_lm.py

The papers: quantized training stops making progress once the exact gradient's norm falls below
about sqrt(3) times the quantization noise, ||g|| < sqrt(3) ||g_q - g||; a late phase in higher
precision recovers the loss, and (NVIDIA) switching the forward to BF16 late recovers most of
it, switching the backward does not. `sqrt3.py` asked this of an MLP whose ratio fell below
sqrt(3) at step 50 of 1000, so a stall could not be told from the start of training.

Here: the project's LM, 4 pre-norm blocks under a scan (d_model 64, 4 heads, d_ff 128, the LM
head in BF16) on the Markov language of order 2 (vocab 32, branching 4), Adam at 1e-2 with 20
warm-up steps, 800 steps of 1024 tokens, NVIDIA's NVFP4 recipe (stochastic rounding on the
gradients: a zero-mean part of the noise exists), 6 seeds (i, i, i). Why this setting: in the
first runs of `randomness_vs_error_lm.py` (the same model and task, round to nearest, 200
steps; looked at before this file was written) the weights' gnr, median over the 29 kernels,
was 1.4 at step 0, 4.3 at step 25 and fell through 3.2 (step 100) to 1.7 at step 175: it
crosses sqrt(3) well after the start, and 800 steps leave most of the run beyond it.

Noise, both parts, at the same weights (`Config.noise_keys`): every 50 steps the shadow gives
the exact gradient g, and the quantized gradient is drawn under 4 further quantization keys at
the same parameters and batch; per kernel `grad/<layer>/gnr` = ||g|| / ||g_q - g|| (the total
noise: bias and zero-mean part) and `gnr_zm` = ||g|| / (the zero-mean part's norm, the spread
over the keys). The claim is tested with each ratio: the first logged step at which the kernels'
median ratio (median over seeds) is below sqrt(3), and whether the training loss still falls
after it (the decrease per 100-step window, t-interval over the 6 seeds).

Late switch (NVIDIA): the last 20 % of steps with the forward GEMM in BF16, with the backward
GEMMs in BF16, with everything in BF16; BF16 throughout as the reference. Measured on the final
held-out loss under a high-precision forward (`loss_gap_hp`: the same exact forward for every
cell, so a forward switch cannot win by changing the measurement), as the verdict's fixed
rows against NVFP4 on the shared seeds.

Choices that could favour an outcome: the setting came from the runs named above (gnr only,
no late-switch cell was run before); the switch point (80 %) and the windows were fixed
before the runs. What it cannot show: the paper's scale (its threshold is argued for large
models and long runs).

Measured: 34 min in all, run in two sittings on cores shared with another job (the first 2
cells in 20 min, stopped for time; `fp4lab run` resumed the other 3 in 14 min; compile 80 s for
a cell, 275 s for one with a phase; about 35 s a run). 30 runs.

What it gave (results/sqrt3_lm/, the kernels' median of the seed medians; 6 seeds):
- The total ratio: 1.51 at step 0 (before Adam has moved the weights), 3.41 at step 50, and
  below sqrt(3) from step 200 of 800 up to the switch (1.46-1.70; `below_sqrt3_from` in
  gnr.csv). The zero-mean part alone never crosses: gnr_zm 6.5 at step 50 falling to 3.6-3.9
  from step 550. What puts the total below sqrt(3) is the bias of the quantized gradient, not
  its zero-mean noise (noise_zm / noise_bias per kernel in the metrics).
- No stall: NVFP4's training loss falls in every 100-step window after the crossing (t-interval
  over seeds above 0 in each; steps 600-699 to 700-799: 0.037 [0.032, 0.042] nats, BF16 0.033
  [0.029, 0.038]), and its distance to BF16's loss shrinks from 0.19 (steps 200-299) to 0.08
  (700-799). The claim fails with either ratio: with the total the ratio is below sqrt(3) for
  three quarters of the run while the loss keeps falling as fast as BF16's; with the zero-mean
  part it never crosses.
- Late switch, held-out gap under a high-precision forward against NVFP4 (the verdict's fixed
  rows, Bonferroni over 4): forward in BF16 -0.038 [-0.052, -0.025] "lower", backward in BF16
  +0.0001 [-0.006, +0.006] "no evidence", all BF16 -0.039 [-0.052, -0.026] "lower", BF16
  throughout -0.063 [-0.095, -0.031]. The forward switch closes 61 % [54, 72] of NVFP4's gap to
  BF16 (Fieller's interval, recovery.csv), the backward switch 0 % [-7, +4]: NVIDIA's finding.
  The gnr shows why: a late BF16 forward lifts the total ratio to 3.0-3.2 at once, a late BF16
  backward leaves it at 1.7-1.8 (the forward's error, not the backward's, dominates the
  gradient's error here).
"""

import numpy as np
import pandas as pd

from fp4lab import analysis
from fp4lab.analysis.intervals import fieller_interval
from fp4lab.schema import SQRT3
from fp4lab.train.config import Config

SEEDS = 6
WINDOW = 100  # steps per window of the training loss
SWITCH = 0.8  # the late phase starts at this fraction of the steps


def get_config():
    return Config(
        task="markov",
        vocab=32,
        order=2,
        branching=4,
        d_model=64,
        n_layers=4,
        scan_layers=True,
        n_heads=4,
        d_ff=128,
        seq_len=64,
        batch_size=16,
        steps=800,
        lr=1e-2,
        warmup=20,
        eval_batches=4,
        seed_batch=6,
        rules=((r"lm_head", "bf16"),),
        recipe="nvfp4",
        telemetry_every=50,
        shadow=True,
        noise_keys=4,
        # the seed calls these committed results were computed with (fp4lab.sweep.compute)
        pad_seeds=True,
    )


def sweep(add):
    add("nvfp4")
    add("nvfp4, late fprop bf16", phases=((SWITCH, {"gemms": {"fprop": "bf16"}}),))
    late_backward = {"gemms": {"dgrad": "bf16", "wgrad": "bf16"}}
    add("nvfp4, late backward bf16", phases=((SWITCH, late_backward),))
    add("nvfp4, late all bf16", phases=((SWITCH, "bf16"),))
    add("bf16", recipe="bf16")


def analyze(results):
    """gnr.csv: per cell, measure (gnr, gnr_zm) and logged step, the median over the kernels
    of the seed-median ratio, the first step below sqrt(3) and the step from which it stays
    below until the switch; progress.csv: per cell and 100-step window, the mean training loss
    and its decrease from the window before (mean and t-interval over seeds); late.csv: the
    verdict's fixed rows on loss_gap_hp against NVFP4; recovery.csv: the share of NVFP4's
    held-out gap to BF16 that each late switch closes."""
    runs, metrics = results.runs, results.metrics
    v = analysis.verdict(runs, "loss_gap_hp", baseline="nvfp4")
    switch = round(SWITCH * int(runs["steps"].iloc[0]))
    return {
        "gnr": gnr_table(runs, metrics, switch),
        "progress": progress_table(runs, metrics),
        "late": analysis.fixed_rows(v),
        "recovery": recovery_table(runs),
    }


def gnr_table(runs, metrics, switch):
    g = analysis.attach(analysis.grad_telemetry(metrics), runs)
    g = g[g["stat"].isin(["gnr", "gnr_zm"]) & g["layer"].str.endswith("kernel")]
    seed_median = g.groupby(["cell", "stat", "layer", "step"], sort=False)["value"].median()
    table = seed_median.groupby(["cell", "stat", "step"], sort=False).median().rename("median")
    table = table.reset_index()
    below = table[table["median"] < SQRT3].groupby(["cell", "stat"], sort=False)["step"].min()
    table = table.join(below.rename("first_below_sqrt3"), on=["cell", "stat"])
    stays = {key: below_from(d, switch) for key, d in table.groupby(["cell", "stat"], sort=False)}
    return table.join(pd.Series(stays, name="below_sqrt3_from"), on=["cell", "stat"])


def below_from(d, switch):
    """The first logged step from which the ratio stays below sqrt(3) up to the switch (NaN if
    it is not below at the last step before it)."""
    before = d[d["step"] < switch].sort_values("step")
    above = before.loc[before["median"] >= SQRT3, "step"]
    if before.empty or before["median"].iloc[-1] >= SQRT3:
        return np.nan
    later = before.loc[before["step"] > above.max(), "step"] if len(above) else before["step"]
    return float(later.min())


def recovery_table(runs):
    """Per late cell: gain = eval_hp(NVFP4) - eval_hp(cell), gap = eval_hp(NVFP4) -
    eval_hp(BF16), paired on the seed triples; the share closed mean(gain) / mean(gap) with
    Fieller's interval (t on n - 1 degrees of freedom)."""
    ok = runs[runs["status"] == "ok"].set_index("seed_init")
    hp = {c: d["eval_hp"].astype(float) for c, d in ok.groupby("cell", sort=False)}
    gap = hp["nvfp4"] - hp["bf16"]
    rows = []
    for cell in [c for c in hp if c.startswith("nvfp4, late")]:
        gain = (hp["nvfp4"] - hp[cell]).reindex(gap.index)
        lo, hi = fieller_interval(gain.to_numpy(), gap.to_numpy())
        share = float(gain.mean() / gap.mean())
        rows.append(dict(cell=cell, gain=gain.mean(), gap=gap.mean(), share_closed=share))
        rows[-1] |= dict(lo=lo, hi=hi, n=len(gap))
    return analysis.with_family(pd.DataFrame(rows), 1)


def progress_table(runs, metrics):
    loss = analysis.attach(analysis.scalar_metric(metrics, "loss"), runs, ("cell", "seed_init"))
    loss["window"] = loss["step"] // WINDOW * WINDOW
    per_seed = loss.groupby(["cell", "seed_init", "window"], sort=False)["value"].mean()
    drop = -per_seed.groupby(["cell", "seed_init"], sort=False).diff()
    rows = []
    for (cell, window), d in drop.dropna().groupby(["cell", "window"], sort=False):
        i = analysis.t_interval(d.to_numpy())
        mean_loss = per_seed.xs((cell, window), level=("cell", "window")).mean()
        rows.append(dict(cell=cell, window=window, loss=mean_loss, decrease=i.estimate))
        rows[-1] |= dict(lo=i.lo, hi=i.hi, n=len(d))
    out = pd.DataFrame(rows)
    word = np.where(out["hi"] < 0, "rising", "no evidence of a change")
    out["trend"] = np.where(out["lo"] > 0, "falling", word)
    return analysis.with_family(out, 1)
