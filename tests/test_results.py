"""The committed results stay small and recompute: all of results/ within 30 MB on disk (the
sweeps compacted, `fp4lab.sweep.compact`), and two rows of results/README.md, the sqrt3 rows'
tables, recomputed to the byte from the committed records and metrics.

The summary indexes a reader builds beside the files (`index.sqlite`) are not counted: they are
derived, ignored by git, built by other tests while this one runs, and removed at the end of the
test run (tests/conftest.py)."""

import subprocess
from pathlib import Path

import pytest

from fp4lab import sweep

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MB = 30


def test_results_take_at_most_30_mb():
    kb = int(
        subprocess.run(
            ["du", "-sk", "--exclude=index.sqlite*", ROOT / "results"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[0]
    )
    assert kb <= LIMIT_MB * 1024, f"results/ takes {kb / 1024:.1f} MB"


@pytest.mark.parametrize("table", ["gnr", "loss"])
def test_a_results_row_recomputes_from_the_committed_files(table):
    """`sqrt3/gnr.csv` (the gradient-to-noise ratio by step, from the per-step metrics) and
    `sqrt3/loss.csv`, which the README's √3 row quotes, as `fp4lab run` writes them."""
    experiment = sweep.load_experiment(ROOT / "experiments" / "sqrt3.py")
    tables = experiment.analyze(sweep.load(ROOT / "results" / "sqrt3"))
    text = tables[table].to_csv(index=False, float_format="%.5g")
    assert text == (ROOT / "results" / "sqrt3" / f"{table}.csv").read_text()
