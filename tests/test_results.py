"""The committed results stay small and recompute: the files of results/ that the repository
carries (`git ls-files`) within 30 MB (the sweeps compacted, `fp4lab.sweep.compact`), and two rows
of results/README.md, the sqrt3 rows' tables, recomputed to the byte from the committed records and
metrics.

Only tracked files count: a user's own output under results/ (README command A writes
results/quickstart, which git ignores) and the summary indexes a reader builds beside the files
(`index.sqlite`, ignored too) are not the repository's size."""

import subprocess
from pathlib import Path

import pytest

import fp4lab as fl
from fp4lab import sweep

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MB = 30


def tracked_bytes(folder: str) -> int:
    """The bytes of the files under `folder` that git tracks (as they are in the work tree)."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--", folder], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    assert any(names), f"git tracks no file under {folder}/"
    return sum((ROOT / name.decode()).stat().st_size for name in names if name)


def test_results_take_at_most_30_mb():
    mb = tracked_bytes("results") / 2**20
    assert mb <= LIMIT_MB, f"the committed results/ take {mb:.1f} MB"


def test_the_size_check_ignores_untracked_output(tmp_path):
    """A user's own results (untracked, here an ignored 1 MB file) leave the count unchanged."""
    before = tracked_bytes("results")
    folder = ROOT / "results" / "quickstart"  # where README command A writes
    made = not folder.exists()
    extra = folder / f"size-probe-{tmp_path.name}.bin"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        extra.write_bytes(b"\0" * 2**20)
        assert tracked_bytes("results") == before
    finally:
        extra.unlink()
        if made:
            folder.rmdir()


@pytest.mark.parametrize("table", ["gnr", "loss"])
def test_a_results_row_recomputes_from_the_committed_files(table):
    """`sqrt3/gnr.csv` (the gradient-to-noise ratio by step, from the per-step metrics) and
    `sqrt3/loss.csv`, which the README's √3 row quotes, as `fp4lab run` writes them."""
    experiment = sweep.load_experiment(ROOT / "experiments" / "sqrt3.py")
    tables = experiment.analyze(fl.load(ROOT / "results" / "sqrt3"))
    text = tables[table].to_csv(index=False, float_format="%.5g")
    assert text == (ROOT / "results" / "sqrt3" / f"{table}.csv").read_text()
