"""Randomness or accumulated error, on the language model: the toolkit's question where the
gradient's error accumulates through the depth of the network.

    fp4lab run experiments/randomness_vs_error_lm.py

Question (the claim of Cim et al. 2026, arXiv 2605.09825): is NVFP4 training's extra loss
driven by randomness (stochastic rounding, random Hadamard signs: what the `quant` seed stream
draws) or by structured quantization error that accumulates on the way back through the
network? `randomness_vs_error.py` asked it of a 3-layer MLP; this asks it of the project's
Llama-style LM, where the drift telemetry shows the gradient's error growing from the head to
the first block while each GEMM's own error stays flat.

Model and task: 4 pre-norm blocks under a scan (d_model 64, 4 heads, d_ff 128, the LM head in
BF16 in every cell) on the synthetic Markov language of order 2 (vocab 32, branching 4: 1024
contexts to learn; its entropy rate is the exact floor), Adam at 1e-2 with 20 warm-up steps,
200 steps of 16 x 64 = 1024 tokens. The Wgrad GEMM contracts over the 1024 tokens of a step,
64 NVFP4 blocks of 16. Why this setting: a pilot (4 seeds, 400 steps; the only look at any cell
before the design was fixed) of BF16 against NVFP4 on three tasks and two learning rates found
NVFP4 measurably worse only here: on the order-1 language both reach the floor within 0.015
nats and differ by less than the seed spread; on order 2 with vocab 32 at 1e-2 NVFP4's held-out
gap at step 400 was 0.10-0.17 nats above BF16's (0.26-0.30) in each of 4 seeds, its training
loss over steps 150-199 0.19-0.32 above, and 1e-2 is BF16's better rate of 1e-2 and 2e-2. The
runs stop at 200 steps, mid-way through learning, to fit the budget (a first launch at 400
steps measured 9-15 s a run: 675 runs would have taken 2.4 h): "worse" here is slower learning
of the contexts, not a divergence (nothing diverges at this scale).

Cells. The base is NVIDIA's NVFP4 recipe (arXiv 2509.25149) with round to nearest everywhere
(`nvfp4-no-sr`: 1x16 E4M3 blocks, 16x16 weight tiles, a 16x16 Hadamard with one fixed random
sign vector on the Wgrad inputs): it draws nothing from the quant stream. Each other cell
changes one thing, either the randomness or the error; the LM head is BF16 everywhere.
  bf16                          the reference
  nvfp4-no-sr                   the deterministic base
  randomness changed only:
  nvfp4                         stochastic rounding on the gradients (NVIDIA's recipe as
                                published): unbiased, more variance per element
  nvfp4-no-sr random signs      the Wgrad Hadamard's signs drawn afresh per layer and step
                                from the quant stream: the same law of error, more randomness
  error changed only (nothing drawn):
  nvfp4-no-sr wgrad=bf16        the Wgrad GEMM in BF16 (less error)
  nvfp4-no-sr no hadamard       the Wgrad Hadamard removed (more error)
  nvfp4-no-sr four-over-six     four-over-six (MAE) on every operand (less error)
The error changes sit on the deterministic base, not on the SR recipe, so that they draw
nothing and need init x data seeds only: the budget's choice. Seeds are random effects: the
two cells that draw from the quant stream run the full 5 x 5 x 5 product of init, data and
quant seeds 0-4 (the minimum the issue asks for: each stream's own variance gets an interval);
the five that draw nothing run 10 x 10 init x data seeds 0-9 with quant seed 0. Two stages:
the first ran 5 x 5 in those five cells too (375 runs); its verdict resolved no contrast, not
even BF16 against the base (-0.298 [-0.685, +0.089]), so the second stage widened the cells
that draw nothing to 10 x 10, chosen after seeing the first (a sequential design, whose
family-wise error rate is somewhat above the nominal 5 %). 750 runs.

Outcomes:
- the final held-out loss gap under a high-precision forward (`loss_gap_hp`: every cell is
  measured with the same exact forward, so the measure itself is not in NVFP4) by the
  verdict: each cell against the deterministic base, and each stream's own SD in each cell
  (its main effect and two-way interactions), with their words;
- the link to accumulation: a run's accumulated gradient drift early in training, `drift` =
  the relative distance ||dy_q - dy|| / ||dy|| of the cotangent arriving at the first block's
  query, key and value projections from the high-precision shadow's (`acc/.../bwd/rel_drift`,
  averaged over the three and over the telemetry steps 25 and 50 of 200), against its final
  `loss_gap_hp`: the correlation within cells, pooled over the quantized cells, seeds resampled
  (`analysis.within_correlation`, coverage-tested), and the cells' mean drift beside their mean
  gap. The measure and the steps were fixed before the runs.

Choices that could favour an outcome, and how they were made: the task, the learning rate and
the length came from the pilot above, chosen for a measurable NVFP4 - BF16 gap, not for any
contrast between NVFP4 cells (none was run); the drift measure was fixed before the runs; the
LM head stays in BF16 in every cell as in `mxfp4_ladder_lm.py`. What the design cannot show:
the paper's magnitudes (its GEMMs contract over thousands of elements), a divergence,
residual-stream outliers (the built-in LM has none), or an error change under stochastic
rounding. Telemetry with the shadow every 25 steps.

Thinning: the committed folder keeps the per-step metrics of the diagonal runs (i, i, i) only;
every run's record and summary, and its `drift`, are in outcomes.csv.

Measured: 44m59s wall for the first stage's 375 runs on two cores (a second job shared them
for about 15 minutes), 59m44s for the second stage's 375 (another sweep shared the cores
throughout), about 7 s a run alone. What it gave (results/randomness_vs_error_lm/; Bonferroni
over the verdict's 22 judged rows):
- Streams: in both cells that draw from the quant stream its own SD is "no evidence": 0
  [0, 0.047] nats (SR, F-test p = 0.50) and 0.015 [0, 0.055] (random signs, p = 0.14), while
  init (0.078, 0.105) and data (0.049, 0.082) "matter" there. Re-drawing only the quant seed
  still moves a run by 0.046 (`redraw_sd`): the init x data x quant term no stream owns.
- Cells, against the deterministic base: BF16 -0.285 [-0.406, -0.163] "lower" (10 x 10);
  the error changes (10 x 10) Wgrad in BF16 -0.017 [-0.060, +0.026], no Hadamard +0.018
  [-0.026, +0.063], four-over-six -0.050 [-0.113, +0.013]; the randomness changes (5 x 5
  pairs) SR -0.073 [-0.389, +0.243], random signs -0.025 [-0.102, +0.053]: none of the five
  is resolved. Each error change's interval lies within 0.12 nats of 0, under half the
  base's gap to BF16; the randomness changes' intervals are wider (5 levels).
- Accumulation: no evidence that a run's early drift predicts its final gap: within cells,
  pooled over the quantized cells, r = +0.12 [-0.60, +0.73] (650 runs; first stage alone
  -0.11 [-0.67, +0.53]); the interval allows a moderate correlation of either sign. Across
  cells, drift is 0.30-0.33 in every quantized cell (BF16 0.006) while their mean gaps span
  1.50-1.57, and SR has the highest drift (0.328) and one of the two lowest gaps. The drift
  measure sits on the Dgrad path (the cotangents reaching block 0), which the Wgrad and
  Hadamard cells do not change.
"""

from pathlib import Path

import numpy as np
import pandas as pd

from fp4lab import analysis, recipes, schema
from fp4lab.core.hadamard import Hadamard
from fp4lab.train.config import Config

LEVELS = 5  # seeds per stream in the cells that draw from the quant stream
WIDE = 10  # init and data seeds in the cells that draw nothing (the second stage)
EARLY = (25, 50)  # the telemetry steps whose drift is averaged
FIRST_BLOCK = tuple(f"blocks.0.attn.{p}" for p in ("query", "key", "value"))

BASE = recipes.get("nvfp4-no-sr")
RANDOM_SIGNS = BASE.replace(
    wgrad_x=BASE.wgrad_x.replace(transform=Hadamard(16, "random")),
    wgrad_dy=BASE.wgrad_dy.replace(transform=Hadamard(16, "random")),
    name="nvfp4-no-sr-random-signs",
)
NO_HADAMARD = recipes.nvfp4_ablation(sr=(), hadamard=(), name="nvfp4-no-sr-no-h")
FOUR_OVER_SIX = BASE.replace(
    **{k: getattr(BASE, k).replace(four_over_six="mae") for k in schema.OPERAND_NAMES},
    name="nvfp4-no-sr-four-over-six",
)


def seeds(quant: int) -> dict:
    """init x data x quant: 5 x 5 x 5 where the cell draws from the quant stream; 10 x 10 x 1
    (quant seed 0) where it draws nothing."""
    levels = list(range(LEVELS if quant > 1 else WIDE))
    return {"init": levels, "data": levels, "quant": levels[:quant]}


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
        steps=200,
        lr=1e-2,
        warmup=20,
        eval_batches=4,
        seed_batch=5,
        rules=((r"lm_head", "bf16"),),
        telemetry_every=25,
        shadow=True,
        # the seed calls these committed results were computed with (fp4lab.sweep.compute)
        pad_seeds=True,
    )


def sweep(add):
    add("bf16", recipe="bf16", seeds=seeds(quant=1))
    add("nvfp4-no-sr", recipe="nvfp4-no-sr", seeds=seeds(quant=1))
    add("nvfp4", recipe="nvfp4", seeds=seeds(LEVELS))
    add("nvfp4-no-sr random signs", recipe=RANDOM_SIGNS, seeds=seeds(LEVELS))
    add("nvfp4-no-sr wgrad=bf16", recipe=BASE, gemms={"wgrad": "bf16"}, seeds=seeds(quant=1))
    add("nvfp4-no-sr no hadamard", recipe=NO_HADAMARD, seeds=seeds(quant=1))
    add("nvfp4-no-sr four-over-six", recipe=FOUR_OVER_SIX, seeds=seeds(quant=1))


def drift(metrics: pd.DataFrame) -> pd.Series:
    """Each run's `drift` (module docstring) from its telemetry, indexed by run_id."""
    keys = [f"acc/{layer}/bwd/rel_drift" for layer in FIRST_BLOCK]
    rows = metrics[metrics["metric"].isin(keys) & metrics["step"].isin(EARLY)]
    return rows.groupby("run_id")["value"].mean().rename("drift")


def run_drift(results) -> pd.Series:
    """`drift` per run: from the telemetry where the folder has it, else (a thinned folder: the
    runs off the diagonal) the value its outcomes.csv recorded when the telemetry was there;
    `fl.sweep.reproduce` regenerates such a run's telemetry bit for bit."""
    found = drift(results.metrics)
    missing = sorted(set(results.runs["run_id"]) - set(found.index))
    if not missing:
        return found
    saved = pd.read_csv(Path(results.path) / "outcomes.csv", index_col="run_id")["drift"]
    return pd.concat([found, saved.loc[missing]])


def analyze(results):
    """verdict.csv: the verdict on loss_gap_hp (each cell against the deterministic base
    nvfp4-no-sr; each stream's own SD per cell); outcomes.csv: each run's cell, seeds,
    loss_gap_hp and drift, written in full (every other table recomputes from it); link.csv:
    the within-cell correlation of drift and loss_gap_hp over the quantized cells, and per
    cell; cells.csv: each cell's mean drift and mean loss_gap_hp."""
    runs = results.runs.join(run_drift(results), on="run_id")
    table = outcomes(runs)
    return {
        "verdict": analysis.with_family(
            analysis.verdict(runs, "loss_gap_hp", baseline="nvfp4-no-sr")
        ),
        "outcomes": table,
        "link": link(runs),
        "cells": cell_means(runs),
    }


def cell_means(runs):
    """Each cell's mean drift and mean loss_gap_hp."""
    return runs.groupby("cell", sort=False)[["drift", "loss_gap_hp"]].mean().reset_index()


def outcomes(runs):
    """Each run's cell, status, seeds, design columns, loss_gap_hp and drift (repr: a CSV read
    gives the same float)."""
    design = [c for c in analysis.verdicts.DESIGN if c in runs.columns]
    cols = ["run_id", "cell", "status", "seed_init", "seed_data", "seed_quant", *design]
    table = runs[cols].copy()
    for c in ("loss_gap_hp", "drift"):
        table[c] = runs[c].map(repr)
    return table


EXCLUDES_0 = {"higher": "yes", "lower": "yes", "no evidence": "no"}  # else "undecided"


def link(runs):
    """The within-cell correlation of drift and loss_gap_hp: pooled over the quantized cells,
    then per cell."""
    quantized = runs[runs["cell"] != "bf16"]
    groups = [("all quantized cells", quantized)] + list(quantized.groupby("cell", sort=False))
    rows = []
    for name, rows_ in groups:
        c = analysis.within_correlation(rows_, "drift", "loss_gap_hp")
        rows.append(dict(cells=name, n=c.n, r=c.r, lo=c.lo, hi=c.hi, method=c.method))
        rows[-1] |= dict(lo_mcse=c.lo_mcse, hi_mcse=c.hi_mcse)
        word = analysis.crossed.side_word(c.lo, c.hi, c.lo_mcse, c.hi_mcse)
        rows[-1]["excludes_0"] = "" if np.isnan(c.lo) else EXCLUDES_0.get(word, word)
    return analysis.with_family(pd.DataFrame(rows), 1)
