"""The committed LM randomness-vs-error tables recompute from its committed outcomes.csv."""

import importlib.util
from pathlib import Path

import pandas as pd

from fp4lab import analysis

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "results" / "randomness_vs_error_lm"


def _experiment():
    path = ROOT / "experiments" / "randomness_vs_error_lm.py"
    spec = importlib.util.spec_from_file_location("randomness_vs_error_lm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _written(table: pd.DataFrame) -> str:
    return table.to_csv(index=False, float_format="%.5g")


def test_link_cells_and_verdict_recompute_from_the_outcomes():
    exp = _experiment()
    runs = pd.read_csv(FOLDER / "outcomes.csv")
    assert len(runs) == 750 and runs["drift"].notna().all()
    assert _written(exp.link(runs)) == (FOLDER / "link.csv").read_text()
    assert _written(exp.cell_means(runs)) == (FOLDER / "cells.csv").read_text()
    verdict = analysis.with_family(analysis.verdict(runs, "loss_gap_hp", baseline="nvfp4-no-sr"))
    assert _written(verdict) == (FOLDER / "verdict.csv").read_text()
