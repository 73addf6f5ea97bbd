"""Stage 2: does keeping the chosen GEMMs in high precision help when the model trains?

Five cells of one config, run through the sweep (`fp4lab.sweep.runner`, the store: a rerun
resumes, finished runs are skipped), each on the same seed triples (i, i, i):

    fp4          every GEMM under the recipe
    hp           every GEMM in the high-precision recipe (BF16 by default)
    top-k        the ranking's set kept in high precision (`choose.top`)
    random-k     random GEMMs at about the same share of GEMM FLOPs (`choose.at_random`)
    last-blocks  whole layers from the deepest up at about that share (`choose.last`)

`gap_table` reads the runs' `eval_hp` (held-out loss of the trained weights under a
high-precision forward) and gives, per cell, the share of the FP4-to-high-precision gap it
closes,

    closed = mean_s (eval_hp(fp4, s) - eval_hp(cell, s)) / mean_s (eval_hp(fp4, s) - eval_hp(hp, s))

over the seeds s both have, with Fieller's interval of the ratio of the paired means
(`fp4lab.analysis.intervals.fieller_interval`; a percentile bootstrap missed about 20 % at
95 % with 4 seeds), and the paired difference of top-k against
random-k and against last-blocks (`fp4lab.analysis.tables.paired_difference`: the crossed
seeds' interval and its verdict, "lower" meaning top-k ends lower).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fp4lab.analysis.intervals import fieller_interval
from fp4lab.analysis.tables import paired_difference
from fp4lab.sweep import runner
from fp4lab.sweep import store as results_store
from fp4lab.sweep.experiment import Cell, Experiment, jsonable, seed_triples
from fp4lab.train.config import Config, make

__all__ = ["CELLS", "cells", "run", "gap_table", "versus"]

CELLS = ("fp4", "hp", "top-k", "random-k", "last-blocks")
_SEEDS = ["seed_init", "seed_data", "seed_quant"]


def cells(recipe, hp, sets: dict[str, list]) -> dict[str, dict]:
    """{label: config overrides} of the five cells; `sets` maps top-k, random-k and
    last-blocks to their rules (`choose.rules`)."""
    plain = {"gemms": (), "backward": "", "phases": (), "rules": ()}
    out = {"fp4": plain | {"recipe": recipe}, "hp": plain | {"recipe": hp}}
    for label in CELLS[2:]:
        rules = tuple(sets[label][:-1])  # the catch-all is the cell's recipe
        out[label] = plain | {"recipe": recipe, "rules": rules}
    return out


def run(
    base: Config, overrides: dict[str, dict], *, seeds: int, out: str | Path, progress: bool
) -> pd.DataFrame:
    """Trains every cell for seeds (i, i, i), i < `seeds`, into the results folder `out`;
    returns its runs table (`fp4lab.load(out).runs`)."""
    if seeds < 4:
        raise ValueError(f"verify needs at least 4 seeds for paired intervals, got {seeds}")
    base = base.replace(eval_batches=base.eval_batches or 4)
    triples = seed_triples([(i, i, i) for i in range(seeds)])
    built = []
    for label, changes in overrides.items():
        cfg = make(dict(changes), base)
        data = results_store.data_hashes(cfg.to_dict())
        built.append(Cell(label, jsonable(dict(changes)), cfg, triples, "", data))
    experiment = Experiment(name="diagnose-verify", path="diagnose-verify.py", base=base,
                            cells=tuple(built))  # fmt: skip
    runner.run_experiment(experiment, out, progress=progress)
    return results_store.load(out, metrics=False).runs


def _paired(runs: pd.DataFrame, cell: str, baseline: str) -> pd.Series:
    """eval_hp(cell, s) - eval_hp(baseline, s) per seed triple s both ran to the end."""
    ok = runs[(runs["status"] == "ok") & np.isfinite(runs["eval_hp"].astype(float))]
    a = ok[ok["cell"] == cell].set_index(_SEEDS)["eval_hp"].astype(float)
    b = ok[ok["cell"] == baseline].set_index(_SEEDS)["eval_hp"].astype(float)
    return (a - b).dropna()


def gap_table(runs: pd.DataFrame, *, level: float = 0.95):
    """Per cell: eval_hp mean, the share of the fp4-to-hp gap closed with its interval, and
    the number of paired seeds (module docstring)."""
    gap = -_paired(runs, "hp", "fp4")  # eval_hp(fp4) - eval_hp(hp), per seed
    rows = []
    for label in CELLS:
        mine = runs[(runs["cell"] == label) & (runs["status"] == "ok")]
        gain = -_paired(runs, label, "fp4")
        both = pd.concat([gain.rename("gain"), gap.rename("gap")], axis=1, join="inner")
        row = {"cell": label, "eval_hp": float(mine["eval_hp"].astype(float).mean())}
        row |= {"pairs": len(both), "gap_closed": np.nan, "lo": np.nan, "hi": np.nan}
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
    """top-k's eval_hp against random-k's and last-blocks' (`paired_difference`, diff =
    top-k - other: negative is better for top-k)."""
    rows = []
    for other in ("random-k", "last-blocks"):
        two = runs[runs["cell"].isin(["top-k", other])]
        table = paired_difference(two, other, outcome="eval_hp", level=level)
        row = table[table["cell"] == "top-k"].iloc[0].to_dict()
        rows.append(
            {"against": other}
            | {k: row[k] for k in ("pairs", "diff", "diff_lo", "diff_hi", "verdict")}
        )
    return pd.DataFrame(rows)
