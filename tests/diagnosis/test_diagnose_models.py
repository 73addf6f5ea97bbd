"""The project's LM, scanned and unscanned, gives the same diagnosis (the stacked layers under
their own names)."""

import numpy as np

import fp4lab as fl

LM = dict(task="markov", d_model=32, n_layers=2, n_heads=2, d_ff=64, seq_len=16, batch_size=8,
          steps=4)  # fmt: skip


def test_the_scanned_lm_is_diagnosed_as_the_unscanned_one():
    runs = {
        scan: fl.diagnose(
            config=fl.Config(**LM, scan_layers=scan), checkpoints=(0, 4), batches=1, quant_seeds=1
        ).table  # fmt: skip
        for scan in (False, True)
    }
    a, b = (t.set_index(["layer", "gemm"]).sort_index() for t in runs.values())
    assert list(a.index) == list(b.index) and len(a) == 3 * 15
    assert "blocks.1.mlp.down" in a.index.get_level_values(0)
    for score in ("own_error", "alone_grad_rel", "removed_grad_rel"):
        # the scan sums in another order: a score's ratio of inner products moves by up to
        # 0.2 % over the short run (1 of 45 at 0.17 % on an AMD EPYC)
        np.testing.assert_allclose(b[score], a[score], rtol=2e-3, atol=1e-5)
    np.testing.assert_array_equal(b["depth"], a["depth"])
    assert (a["own_error"] > 0.01).all()  # every GEMM quantized for real in its variant
