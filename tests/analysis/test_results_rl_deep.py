"""The committed tables of the deep-policy GRPO study recompute from its per-seed table:
results/rl_deep/paired.csv (the contrasts and their words) and the means and intervals of
variants.csv, from seeds.csv (what `python experiments/rl_deep.py` wrote). The committed
seeds.csv holds 5 significant digits, so the numbers agree to that and the words exactly."""

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "results" / "rl_deep"


def _experiment():
    path = ROOT / "experiments" / "rl_deep.py"
    spec = importlib.util.spec_from_file_location("rl_deep", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _same(recomputed: pd.DataFrame, committed: pd.DataFrame) -> None:
    assert list(recomputed.columns) == list(committed.columns)
    for column in committed:
        if committed[column].dtype.kind == "f":
            np.testing.assert_allclose(recomputed[column], committed[column], rtol=1e-3, atol=1e-6)
        else:
            assert recomputed[column].tolist() == committed[column].tolist(), column


def test_paired_and_variants_recompute_from_the_seeds():
    exp = _experiment()
    seeds = pd.read_csv(FOLDER / "seeds.csv")
    assert len(seeds) == 7 * 8 + 5 * 8 + 9 * 6
    _same(exp.paired_from_seeds(seeds), pd.read_csv(FOLDER / "paired.csv"))
    committed = pd.read_csv(FOLDER / "variants.csv")
    rows = [
        exp.variant_row(study, variant, d.reset_index(drop=True), seconds)
        for (study, variant), d in seeds.groupby(["study", "variant"], sort=False)
        for seconds in committed.loc[
            (committed.study == study) & (committed.variant == variant), "seconds"
        ]
    ]
    _same(pd.DataFrame(rows), committed)
