"""Stage 2: does keeping the chosen GEMMs in high precision help when the model trains?

Cells of one config, run through the sweep (`fp4lab.sweep.runner`, the store: a rerun
resumes, finished runs are skipped), each on the same seed triples (i, i, i):

    fp4          every GEMM under the recipe
    hp           every GEMM in the high-precision recipe (BF16 by default)
    top-k        the ranking's set kept in high precision (`choose.top`)
    random-k:j   random GEMMs within top-k's share of GEMM FLOPs, draw j (`choose.random_sets`);
                 "random-k" in the tables is their mean per seed triple
    last-blocks  whole layers from the deepest up within that share (`choose.last`)

`gap_table` reads an outcome of the runs (`eval_hp`, the held-out loss of the trained weights
under a high-precision forward, or `eval_loss`, the same under the run's own forward) and
gives, per cell, the share of the FP4-to-high-precision gap it closes,

    closed = mean_s (out(fp4, s) - out(cell, s)) / mean_s (out(fp4, s) - out(hp, s))

over the seeds s both have, with Fieller's interval of the ratio of the paired means
(`fp4lab.analysis.intervals.fieller_interval`; a percentile bootstrap missed about 20 % at
95 % with 4 seeds), and the paired difference of top-k against
random-k and against last-blocks (`fp4lab.analysis.tables.paired_difference`: the crossed
seeds' interval and its verdict, "lower" meaning top-k ends lower). `gap` gives the FP4-to-hp
gap itself with its t-interval over the paired seeds: when the interval holds 0 the gap is not
resolved and no share of it means much.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fp4lab.analysis.intervals import fieller_interval, t_interval
from fp4lab.analysis.tables import paired_difference
from fp4lab.sweep import runner
from fp4lab.sweep import store as results_store
from fp4lab.sweep.experiment import Cell, Experiment, jsonable, seed_triples
from fp4lab.train.config import Config, make

__all__ = ["CELLS", "cells", "experiment", "run", "gap", "gap_table", "versus", "random_label"]

CELLS = ("fp4", "hp", "top-k", "random-k", "last-blocks")  # the rows of `gap_table`
_SEEDS = ["seed_init", "seed_data", "seed_quant"]


def random_label(j: int) -> str:
    """The cell label of random draw j."""
    return f"random-k:{j}"


def cells(recipe, hp, sets: dict[str, list], keep=()) -> dict[str, dict]:
    """{label: config overrides} of the cells; `sets` maps top-k, each random-k:j and
    last-blocks to their rules (`choose.rules`); `keep`: path patterns left unquantized in
    the fp4 cell too."""
    plain = {"gemms": (), "backward": "", "phases": (), "rules": ()}
    fp4 = {"recipe": recipe, "rules": tuple((path, None) for path in keep)}
    out = {"fp4": plain | fp4, "hp": plain | {"recipe": hp}}
    for label, rules in sets.items():
        out[label] = plain | {"recipe": recipe, "rules": tuple(rules[:-1])}  # less the catch-all
    return out


def experiment(base: Config, overrides: dict[str, dict], *, seeds: int) -> Experiment:
    """The sweep's experiment of the cells `overrides` on seeds (i, i, i), i < `seeds`: every
    cell's config built (a bad one raises here, before anything trains)."""
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 4:
        raise ValueError(f"verify needs at least 4 seeds for paired intervals, got {seeds!r}")
    base = base.replace(eval_batches=base.eval_batches or 4)
    triples = seed_triples([(i, i, i) for i in range(seeds)])
    built = []
    for label, changes in overrides.items():
        cfg = make(dict(changes), base)
        data = results_store.data_hashes(cfg.to_dict())
        built.append(Cell(label, jsonable(dict(changes)), cfg, triples, "", data))
    return Experiment(name="diagnose-verify", path="diagnose-verify.py", base=base,
                      cells=tuple(built))  # fmt: skip


def run(
    base: Config, overrides: dict[str, dict], *, seeds: int, out: str | Path, progress: bool
) -> pd.DataFrame:
    """Trains every cell for seeds (i, i, i), i < `seeds`, into the results folder `out`;
    returns its runs table (`fp4lab.load(out).runs`)."""
    runner.run_experiment(experiment(base, overrides, seeds=seeds), out, progress=progress)
    return results_store.load(out, metrics=False).runs


def _pooled(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` and, as cell "random-k", the random draws' finished runs averaged per seed triple
    (each outcome column: the mean of the draws that ran to the end)."""
    draws = runs["cell"].astype(str).str.startswith("random-k:") & (runs["status"] == "ok")
    if not draws.any():
        return runs
    numeric = [c for c in ("eval_hp", "eval_loss") if c in runs.columns]
    mean = (
        runs[draws]
        .groupby(_SEEDS, as_index=False)[numeric]
        .agg(lambda v: float(np.nanmean(v.astype(float))))
    )
    mean = mean.assign(cell="random-k", status="ok")
    return pd.concat([runs, mean], ignore_index=True)


def _paired(runs: pd.DataFrame, cell: str, baseline: str, outcome: str) -> pd.Series:
    """out(cell, s) - out(baseline, s) per seed triple s both ran to the end."""
    ok = runs[(runs["status"] == "ok") & np.isfinite(runs[outcome].astype(float))]
    a = ok[ok["cell"] == cell].set_index(_SEEDS)[outcome].astype(float)
    b = ok[ok["cell"] == baseline].set_index(_SEEDS)[outcome].astype(float)
    return (a - b).dropna()


def gap(runs: pd.DataFrame, *, outcome: str = "eval_hp", level: float = 0.95):
    """The FP4-to-hp gap, out(fp4) - out(hp), paired per seed: (mean, lo, hi, pairs), the
    t-interval at `level` (NaN ends below 3 pairs)."""
    d = -_paired(runs, "hp", "fp4", outcome)
    ci = t_interval(d.to_numpy(np.float64), level)
    return ci.estimate, ci.lo, ci.hi, len(d)


def gap_table(runs: pd.DataFrame, *, outcome: str = "eval_hp", level: float = 0.95):
    """Per cell (`CELLS`, then each random draw): the outcome's mean, the share of the
    fp4-to-hp gap closed with its interval (`family` 1: each at `level` on its own), and the
    number of paired seeds (module docstring)."""
    runs = _pooled(runs)
    gap_s = -_paired(runs, "hp", "fp4", outcome)  # out(fp4) - out(hp), per seed
    draws = sorted(c for c in runs["cell"].unique() if str(c).startswith("random-k:"))
    rows = []
    for label in [*CELLS, *draws]:
        mine = runs[(runs["cell"] == label) & (runs["status"] == "ok")]
        gain = -_paired(runs, label, "fp4", outcome)
        both = pd.concat([gain.rename("gain"), gap_s.rename("gap")], axis=1, join="inner")
        row = {"cell": label, outcome: float(mine[outcome].astype(float).mean())}
        row |= {"pairs": len(both), "gap_closed": np.nan, "lo": np.nan, "hi": np.nan, "family": 1}
        if len(both):
            g, d = both["gain"].to_numpy(), both["gap"].to_numpy()
            with np.errstate(invalid="ignore", divide="ignore"):
                row["gap_closed"] = float(g.mean() / d.mean())
                if label not in ("fp4", "hp"):  # those two close 0 and 1 by definition
                    row["lo"], row["hi"] = fieller_interval(g, d, level)
                else:
                    row["lo"] = row["hi"] = row["gap_closed"]
        rows.append(row)
    return pd.DataFrame(rows)


def versus(runs: pd.DataFrame, *, level: float = 0.95) -> pd.DataFrame:
    """top-k's eval_hp against random-k's (the draws' mean per seed) and last-blocks'
    (`paired_difference`, diff = top-k - other: negative is better for top-k); a row only
    where both cells ran."""
    runs = _pooled(runs)
    rows = []
    for other in ("random-k", "last-blocks"):
        if not {"top-k", other} <= set(runs["cell"]):  # a cell stage 2 had no set for
            continue
        two = runs[runs["cell"].isin(["top-k", other])]
        table = paired_difference(two, other, outcome="eval_hp", level=level)
        row = table[table["cell"] == "top-k"].iloc[0].to_dict()
        rows.append(
            {"against": other}
            | {k: row[k] for k in ("pairs", "diff", "diff_lo", "diff_hi", "diff_mcse")}
            | {"family": 1, "verdict": row["verdict"]}
        )
    columns = ["against", "pairs", "diff", "diff_lo", "diff_hi", "diff_mcse", "family", "verdict"]
    return pd.DataFrame(rows, columns=columns)
