"""Divergence: a non-finite loss, or a loss beyond spike_factor x the run's first loss, counts at
once whatever the history; a spike against the recent losses still needs its window."""

import jax.numpy as jnp
import numpy as np
import pytest

from fp4lab import sweep
from fp4lab.train import divergence
from fp4lab.train.config import Config

MLP = dict(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,), batch_size=32)


def diverged_at(losses, factor=5.0, window=20):
    state = divergence.init(window)
    for t, loss in enumerate(losses):
        state = divergence.update(state, jnp.float32(loss), jnp.int32(t), factor)
    return int(state.step), divergence.DIVERGENCE_KINDS[int(state.kind)]


# ---------------------------------------------------------------------------------------------
# Divergence: a non-finite loss, or a loss beyond spike_factor x the first, counts at once.


@pytest.mark.parametrize(
    "losses, expect",
    [
        ([0.83, 0.9, 6.5e8, 6.4e8], (2, "spike")),  # the probe's run at lr=30
        ([0.83, 4.1, 4.0, 4.1], (-1, "")),  # below 5 x 0.83 = 4.15
        ([0.83, 0.8, np.inf], (2, "nonfinite")),
        ([2.0, np.nan], (1, "nonfinite")),
        ([-1.0, 3.0, 8.0], (-1, "")),  # a first loss <= 0 sets no scale
    ],
)
def test_a_blow_up_counts_at_once_whatever_the_history(losses, expect):
    assert diverged_at(losses) == expect


def test_a_spike_against_the_recent_losses_still_needs_its_window():
    losses = [1.0] * 5 + [0.1] * 20 + [0.9]  # 9 x the median of the 20 before, < 5 x the first
    assert diverged_at(losses) == (25, "spike")
    assert diverged_at(losses[:6]) == (-1, "")


def test_a_run_that_blows_up_is_counted_as_diverged():
    cfg = Config(**MLP, steps=6, eval_batches=1, seed_batch=1, lr=30.0, warmup=0)
    cfg = cfg.replace(schedule="constant")
    (out,) = sweep.compute_cell(cfg.to_dict(), [(0, 0, 0)])
    loss, s = out["series"]["loss"], out["summary"]
    first = next(t for t in range(1, len(loss)) if not loss[t] <= 5 * loss[0])
    assert first < 6 and s["diverged"] and s["divergence_step"] == first
    assert s["divergence_kind"] == ("spike" if np.isfinite(loss[first]) else "nonfinite")
