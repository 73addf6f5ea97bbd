"""The outliers the MXFP4 ladder with outlier channels is about are in its committed flush.csv
(that its tables recompute from the committed runs: test_results_ladder_lm.py)."""

from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "results" / "mxfp4_ladder_lm_outliers"


def test_the_outliers_crush_block_0_in_every_mxfp4_cell_and_fp8_flushes_nothing():
    flush = pd.read_csv(FOLDER / "flush.csv").set_index(["cell", "input", "block"])
    late = flush["step_500"]
    assert (flush.loc["fp8"].to_numpy() < 1e-3).all()
    no_rotation = late.loc[["fprop", "fprop+dgrad", "fprop+dgrad+wgrad", "all+sr"]]
    # block 0's attention input: a third or more of its elements flushed to the end of the run
    assert (no_rotation.xs(("attention input", 0), level=(1, 2)) > 0.3).all()
    # ... more than three times a later block's, and a 32-wide rotation brings it to their level
    assert (no_rotation.xs(0, level=2) > 2.5 * no_rotation.xs(3, level=2)).all()
    assert late.loc[("all+h32", "attention input", 0)] < late.loc[("all+h32", "attention input", 3)]
