"""Forks: the parent's prefix bit for bit, one change from the fork's step, the parent's id kept.

The parent is a model of our own whose loss jumps 100x at step 25 (a planted spike), so the
event and the fork's step are known exactly.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
import pytest
from flax import nnx

import fp4lab as fl
from fp4lab.analysis import instability
from fp4lab.sweep import forks
from fp4lab.train.config import Config, ConfigError
from fp4lab.train.trainer import make_keys, make_optimizer, make_train

EVENT = 25


def model(config, rngs):
    return nnx.Sequential(
        nnx.Linear(16, 32, rngs=rngs), nnx.LayerNorm(32, rngs=rngs), nnx.Linear(32, 1, rngs=rngs)
    )


def batch(key, step):
    return jax.random.normal(key, (8, 16)), step


def loss(model, batch):
    x, step = batch
    return jnp.mean(jnp.square(model(x) - 1.0)) * jnp.where(step == EVENT, 100.0, 1.0)


BASE = Config(steps=40, lr=0.01, clip_norm=0.0, warmup=0, schedule="constant", eval_batches=1)
CHANGES = {"same": {}, "lr/10": {"lr_scale": 0.1}, "ln hp": {"gemms": {"norms": None}}}


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    out = tmp_path_factory.mktemp("parent")
    cells = {"bf16+ln": {"recipe": "bf16", "gemms": {"norms": fl.mxfp4()}}}
    res = fl.own.sweep(model, loss, batch, cells, BASE, seeds=2, out=out, progress=False)
    return out, res


def test_forks_are_taken_before_each_run_s_first_event(parent):
    out, res = parent
    assert list(res.runs["first_spike"]) == [EVENT, EVENT]
    found = forks.fork_cells(out, changes=CHANGES, before=5)
    assert len(found) == 2 * len(CHANGES)
    assert {f.step for f in found} == {EVENT - 5} and {f.event for f in found} == {EVENT}
    for f in found:
        assert forks.parent_of(f.label) == (f.change, f.parent)
        assert f.parent in set(res.runs["run_id"])
        phase = f.config["phases"][-1]
        assert phase[0] == EVENT - 5
    ln = next(f for f in found if f.change == "ln hp")
    assert dict(ln.config["phases"][-1][1]["gemms"]) == {"norms": None}  # merged, one change
    with pytest.raises(ValueError, match="before"):
        forks.fork_cells(out, changes=CHANGES, before=0)
    with pytest.raises(ValueError, match="no cells"):
        forks.fork_cells(out, changes=CHANGES, cells=["nope"])


def test_a_fork_s_prefix_is_the_parent_s_bit_for_bit(parent):
    out, res = parent
    series = fl.load(out, metrics=["loss", "grad_norm"]).metrics
    trains = {}  # one program per change: both parents' forks share it (their seeds differ)
    for f in forks.fork_cells(out, changes=CHANGES, before=5):
        cfg = Config.from_dict(f.config)
        if cfg not in trains:
            trains[cfg] = jax.jit(make_train(cfg))
        arrays = trains[cfg](make_keys(*f.seeds))
        mine = series[series["run_id"] == f.parent].pivot(index="step", columns="metric")
        for name in ("loss", "grad_norm"):
            stored = mine["value"][name].to_numpy(np.float32)
            np.testing.assert_array_equal(arrays[name][: f.step], stored[: f.step])
            if f.change == "same":  # a deterministic recipe: the parent again, to the end
                np.testing.assert_array_equal(arrays[name], stored)
            else:
                assert not np.array_equal(arrays[name][f.step :], stored[f.step :])


def test_lr_scale_scales_the_learning_rate_from_its_phase_on():
    cfg = BASE.replace(schedule="cosine", warmup=5, phases=((20, {"lr_scale": 0.25}),))
    plain = BASE.replace(schedule="cosine", warmup=5)
    scaled, unscaled = make_optimizer(cfg), make_optimizer(plain)
    params = {"w": jnp.ones(3)}
    s1, s2 = scaled.init(params), unscaled.init(params)
    for t in range(30):
        g = {"w": jnp.full(3, 0.1 * (t + 1))}
        u1, s1 = scaled.update(g, s1, params)
        u2, s2 = unscaled.update(g, s2, params)
        want = u2["w"] if t < 20 else u2["w"] * 0.25
        np.testing.assert_allclose(u1["w"], want, rtol=1e-6)
        if t < 20:
            np.testing.assert_array_equal(u1["w"], u2["w"])  # bit for bit before the phase
    assert cfg.lr_scales() == [(20, 0.25)] and plain.lr_scales() == []
    with pytest.raises(ConfigError, match="lr_scale"):
        BASE.replace(phases=((20, {"lr_scale": 0}),))
    assert optax  # the optimizer under test is optax's


def test_fork_outcomes_count_averted_and_delayed_with_exact_intervals():
    table = pd.DataFrame(
        {
            "change": ["a"] * 8 + ["b"] * 8,
            "event": [100] * 16,
            "fork_first": [np.nan] * 7 + [100.0] + [100.0] * 6 + [180.0, np.nan],
            "delay": [20] * 16,
        }
    )
    out = instability.fork_outcomes(table).set_index("change")
    assert out.loc["a", "averted"] == 7 and out.loc["b", "averted"] == 1
    assert out.loc["b", "delayed"] == 1
    ci = fl.analysis.exact_binomial_interval(7, 8)
    assert out.loc["a", "averted_lo"] == pytest.approx(ci.lo)
    assert out.loc["b", "averted_or_delayed_rate"] == pytest.approx(2 / 8)
