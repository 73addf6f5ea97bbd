"""The spike detector on planted spikes: recovered excursions count, noise does not."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from fp4lab.train import divergence, spikes


def _curve(n=600, seed=0, noise=0.05):
    """A decaying loss with multiplicative noise (log-normal, sd `noise`)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return (0.05 + 1.0 * np.exp(-t / 80)) * np.exp(noise * rng.standard_normal(n))


def _plant(loss, step, size, length):
    out = loss.copy()
    out[step : step + length] *= size
    return out


def test_planted_spikes_are_found_with_step_size_and_length():
    loss = _curve()
    loss = _plant(loss, 200, 4.0, 5)  # a sharp excursion that recovers
    loss = _plant(loss, 350, 3.0, 1)  # a one-step one
    loss = _plant(loss, 500, 2.5, 30)  # a slower one
    found = spikes.events(loss)
    assert [e.step for e in found] == [200, 350, 500]
    assert [e.length for e in found] == [5, 1, 30]
    assert all(e.recovered for e in found)
    # sizes: the planted factor times the noise at the peak over the median of the clean losses
    for e, planted in zip(found, (4.0, 3.0, 2.5), strict=True):
        assert planted * 0.8 < e.size < planted * 1.25


def test_noise_alone_gives_no_event_and_a_clean_summary():
    for seed in range(20):
        assert spikes.events(_curve(seed=seed)) == []
    s = spikes.summary(_curve())
    assert s["spikes"] == 0 and math.isnan(s["first_spike"]) and math.isnan(s["max_spike"])
    assert s["diverged_at_end"] is False and s["spike_events"] == ""


def test_recovered_spikes_that_the_in_run_divergence_rule_misses():
    """3x excursions that recover: below the 5x divergence rule, caught as spike events."""
    loss = _plant(_plant(_curve(), 300, 3.0, 4), 450, 3.0, 2)
    state = divergence.init(20)
    for t, x in enumerate(loss):
        state = divergence.update(state, jnp.float32(x), jnp.int32(t), 5.0)
    assert int(state.step) == -1  # the in-run rule sees no divergence
    s = spikes.summary(loss)
    assert s["spikes"] == 2 and s["first_spike"] == 300 and not s["diverged_at_end"]
    assert s["spike_events"].startswith("300:") and ";450:" in s["spike_events"]


def test_a_run_that_ends_inside_an_event_or_non_finite_diverged_at_end():
    loss = _curve()
    up = loss.copy()
    up[550:] *= np.linspace(3, 50, 50)
    s = spikes.summary(up)
    assert s["spikes"] == 1 and s["first_spike"] == 550 and s["diverged_at_end"]
    nan = loss.copy()
    nan[420:] = np.nan
    found = spikes.events(nan)
    assert [(e.step, e.size, e.recovered) for e in found] == [(420, math.inf, False)]
    assert spikes.summary(nan)["diverged_at_end"]
    # a NaN step that recovers is an event too, and the line is drawn from the losses before
    blip = loss.copy()
    blip[300] = np.inf
    assert [(e.step, e.length, e.recovered) for e in spikes.events(blip)] == [(300, 1, True)]


def test_the_reference_is_frozen_during_an_event():
    """A long plateau at 2.5x stays one event: its own losses never lift the line."""
    loss = np.full(400, 1.0)
    loss[100:300] = 2.5
    found = spikes.events(loss)
    assert [(e.step, e.length, e.size) for e in found] == [(100, 200, 2.5)]


def test_no_event_before_the_window_fills_and_bad_arguments_are_refused():
    loss = np.ones(50)
    loss[5] = 100.0  # before 20 losses exist: no reference yet
    assert spikes.events(loss) == []
    assert spikes.events(loss, window=3)[0].step == 5
    with pytest.raises(ValueError, match="factor"):
        spikes.events(loss, factor=1.0)
    with pytest.raises(ValueError, match="window"):
        spikes.events(loss, window=0)
    assert spikes.summary(np.zeros(0))["spikes"] == 0
