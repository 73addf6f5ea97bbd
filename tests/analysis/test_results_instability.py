"""The committed instability tables recompute, byte for byte, from the committed records of
results/instability_*/ (what `fp4lab run experiments/instability_*.py` wrote), and every
instability experiment file plans its cells (its configs valid, the forks found in the
committed parent)."""

import shutil
from pathlib import Path

import pandas as pd
import pytest

import fp4lab as fl
from fp4lab import sweep

ROOT = Path(__file__).resolve().parents[2]
# study -> the tables its analyze recomputes from the records alone
TABLES = {
    "instability_proxy": ("rates", "contrasts"),
    "instability_damping": ("rates", "contrasts"),
    "instability_outputs": ("rates", "contrasts"),
    "instability_forks": ("forks", "averted"),
    "instability_forks_fresh_parents": ("rates", "contrasts"),
    "instability_forks_fresh": ("forks", "averted"),
    "instability_fp8_seeds": ("rates", "contrasts"),
    "instability_sr_seeds": ("rates", "contrasts", "loss"),
    "instability_streams": ("attribution", "rates"),
    "instability_proxy_lr": ("rates", "lr_loss", "sensitivity"),
    "instability_lm": ("rates", "contrasts", "contrasts_diverged", "lr_loss", "sensitivity"),
    "instability_recipes_lr": ("rates", "lr_loss", "sensitivity"),
    "instability_lm_signals": ("rates", "growth", "predict"),
}
SERIES = {"instability_lm_signals"}  # studies whose committed folder keeps the per-step series


def _written(table: pd.DataFrame) -> str:
    return table.to_csv(index=False, float_format="%.5g")


@pytest.mark.parametrize("study", sorted(TABLES))
def test_the_tables_recompute_from_the_records(study, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the forks' and the lr study's parent paths are the repository's
    experiment = sweep.load_experiment(ROOT / "experiments" / f"{study}.py")
    folder = ROOT / "results" / study
    if study in SERIES:  # its analyze draws figures from the series: into a copy
        folder = Path(shutil.copytree(folder, tmp_path / study))
    tables = experiment.analyze(fl.load(folder, metrics=study in SERIES))
    for name in TABLES[study]:
        assert _written(tables[name]) == (ROOT / "results" / study / f"{name}.csv").read_text()


@pytest.mark.parametrize("study", [*sorted(TABLES), "instability_proxy_key"])
def test_every_instability_study_plans_its_cells(study, monkeypatch):
    monkeypatch.chdir(ROOT)
    experiment = sweep.load_experiment(ROOT / "experiments" / f"{study}.py")
    assert experiment.cells and all(cell.seeds for cell in experiment.cells)
    if study in ("instability_forks", "instability_forks_fresh"):  # a fork per change and parent
        assert sum(len(cell.seeds) for cell in experiment.cells) == 3 * 6
