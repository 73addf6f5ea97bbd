import jax.numpy as jnp

from fp4lab import analysis


def test_to_frame_is_tidy():
    metrics = {"quant/up/fprop/x/rel_err": jnp.array([0.1, 0.2]), "grad/up.kernel/gnr": 3.0}
    df = analysis.to_frame(metrics)
    assert list(df.columns) == ["step", "layer", "gemm", "operand", "stat", "value"]
    assert len(df) == 3
    assert set(df.step) == {0, 1}
    one = analysis.to_frame({"quant/up/fprop/x/rel_err": 0.5}, step=7)
    assert one.step.tolist() == [7]
