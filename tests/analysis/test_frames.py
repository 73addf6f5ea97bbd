import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from fp4lab import analysis


def test_to_frame_is_tidy():
    metrics = {"quant/up/fprop/x/rel_err": jnp.array([0.1, 0.2]), "grad/up.kernel/gnr": 3.0}
    df = analysis.to_frame(metrics)
    assert list(df.columns) == ["step", "layer", "gemm", "operand", "stat", "value"]
    assert len(df) == 3
    assert set(df.step) == {0, 1}
    one = analysis.to_frame({"quant/up/fprop/x/rel_err": 0.5}, step=7)
    assert one.step.tolist() == [7]


def test_no_summary_column_is_taken_for_a_design_factor():
    """Every column a run summarizes (schema.RUNS_COLUMNS), varying from run to run, leaves the
    design to the config: a baseline matched on initial_loss had no partner (a tokens-to-target
    table with a target set showed no baseline and no overhead)."""
    from fp4lab.analysis import tables
    from fp4lab.analysis.factors import design_factors
    from fp4lab.schema import RUNS_COLUMNS

    rng = np.random.default_rng(0)
    rows = []
    for recipe in ("bf16", "nvfp4"):
        for seed in range(3):
            row = {c: float(rng.uniform(1, 2)) for c in RUNS_COLUMNS}  # each run its own value
            row |= {"run_id": f"{recipe}{seed}", "experiment": "e", "cell": recipe, "status": "ok"}
            row |= {f"seed_{s}": seed for s in ("init", "data", "quant")}
            row |= {"recipe": recipe, "lr": 1e-2, "tokens_per_step": 32.0, "target_loss": 0.4}
            row["tokens_to_target"] = 32.0 * (19 + seed + 2 * (recipe == "nvfp4"))
            rows.append(row)
    runs = pd.DataFrame(rows)
    assert design_factors(runs) == ["recipe"]
    baseline, match = tables.default_baseline(runs)
    assert (baseline, match) == ({"recipe": "bf16"}, [])
    t = tables.tokens_to_target(runs, baseline=baseline, match=match).set_index("cell")
    assert t.loc["bf16", "overhead"] == 0.0
    assert t.loc["nvfp4", "overhead"] == pytest.approx(
        np.exp(np.mean(np.log([21, 22, 23])) - np.mean(np.log([19, 20, 21]))) - 1
    )


def test_identical_outcomes_give_no_shares_and_no_numpy_warning():
    import warnings

    from fp4lab.analysis import factors

    runs = pd.DataFrame({"run_id": list("abcd"), "experiment": "e", "cell": ["x", "x", "y", "y"],
                         "status": "ok", "seed_init": [0, 1, 0, 1], "seed_data": [0, 1, 0, 1],
                         "seed_quant": [0, 1, 0, 1], "recipe": ["bf16", "bf16", "fp32", "fp32"],
                         "final_loss": [1.0] * 4})  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = factors.variance_decomposition(runs, "final_loss")
    assert table["eta2"].isna().all()
