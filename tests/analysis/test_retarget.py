"""analysis.retarget: tokens to target read again from another stored series, checked against a
hand computation and against the trainer's own reading (`fp4lab.train.summary`)."""

import numpy as np
import pandas as pd
import pytest

from fp4lab import analysis
from fp4lab.train.summary import tokens_to_target as trainer_reading


def _tables(series: dict[str, list[float]], status=None, target=1.0, window=2, tps=10):
    runs = pd.DataFrame(
        {
            "run_id": list(series),
            "status": status or ["ok"] * len(series),
            "target_loss": target,
            "target_window": window,
            "tokens_per_step": tps,
            "tokens_to_target": -1.0,
        }
    )
    rows = [(rid, step, "loss", value) for rid, v in series.items() for step, value in enumerate(v)]
    metrics = pd.DataFrame(rows, columns=["run_id", "step", "metric", "value"])
    return runs, metrics


def test_first_step_where_the_window_mean_reaches_the_target():
    # window means of a: 2.5, 1.5, 0.75 -> reached after step 3 (4 steps = 40 tokens);
    # b never gets there; c's only low window holds a NaN, which never counts as reached
    runs, metrics = _tables({"a": [3, 2, 1, 0.5, 0.4], "b": [3, 3, 3], "c": [3, np.nan, 0.1]})
    got = analysis.retarget(runs, metrics.sample(frac=1.0, random_state=0))  # any row order
    np.testing.assert_array_equal(got["tokens_to_target"], [40.0, np.nan, np.nan])
    assert runs["tokens_to_target"].eq(-1.0).all()  # the input is left alone


def test_agrees_with_the_trainer_on_random_series():
    rng = np.random.default_rng(0)
    series = {
        f"r{i}": list(2.0 * np.exp(-np.arange(60) / 20) + rng.normal(0, 0.1, 60)) for i in range(20)
    }
    runs, metrics = _tables(series, target=0.9, window=5, tps=1024)
    got = analysis.retarget(runs, metrics)["tokens_to_target"].to_numpy()
    want = [trainer_reading(np.asarray(v), 0.9, 5, 1024) for v in series.values()]
    np.testing.assert_array_equal(got, want)
    assert np.isfinite(got).sum() >= 10  # the check is about reached runs, not only NaNs


def test_failed_runs_get_nan_and_a_missing_series_is_an_error():
    runs, metrics = _tables({"a": [0.1, 0.1], "b": [0.1, 0.1]}, status=["ok", "failed"])
    got = analysis.retarget(runs, metrics[metrics.run_id == "a"])
    np.testing.assert_array_equal(got["tokens_to_target"], [20.0, np.nan])
    with pytest.raises(ValueError, match="no 'loss_hp' series"):
        analysis.retarget(runs, metrics, series="loss_hp")
    with pytest.raises(ValueError, match="target_window"):
        analysis.retarget(runs.drop(columns="target_window"), metrics)
