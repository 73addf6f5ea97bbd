"""The committed LM sqrt(3) tables recompute, byte for byte, from the committed records and
metrics of results/sqrt3_lm (what `fp4lab run experiments/sqrt3_lm.py` wrote)."""

import importlib.util
from pathlib import Path

import pandas as pd

import fp4lab as fl
from fp4lab import analysis

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "results" / "sqrt3_lm"


def _experiment():
    path = ROOT / "experiments" / "sqrt3_lm.py"
    spec = importlib.util.spec_from_file_location("sqrt3_lm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _written(table: pd.DataFrame) -> str:
    return table.to_csv(index=False, float_format="%.5g")


def test_late_switch_tables_recompute_from_the_records():
    exp = _experiment()
    runs = fl.load(FOLDER, metrics=False).runs
    assert len(runs) == 30 and (runs["status"] == "ok").all()
    v = analysis.verdict(runs, "loss_gap_hp", baseline="nvfp4")
    assert _written(analysis.fixed_rows(v)) == (FOLDER / "late.csv").read_text()
    assert _written(exp.recovery_table(runs)) == (FOLDER / "recovery.csv").read_text()


def test_progress_recomputes_from_the_loss_series():
    exp = _experiment()
    results = fl.load(FOLDER, metrics="loss")
    table = exp.progress_table(results.runs, results.metrics)
    assert _written(table) == (FOLDER / "progress.csv").read_text()
