"""The trainer: determinism, seed streams, the entropy floor, divergence, loss scaling, phases."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fp4lab import sweep, train
from fp4lab.train.config import Config, ConfigError, make

TINY = dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, seq_len=16, batch_size=8, vocab=32)
# quantized recipes compile in seconds on a two-layer MLP, in minutes on a transformer
MLP = dict(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,), batch_size=32)


def tiny(**kw) -> Config:
    return Config(**(TINY | dict(steps=4, eval_batches=1, seed_batch=4) | kw))


def mlp(**kw) -> Config:
    return Config(**(MLP | dict(steps=4, eval_batches=1, seed_batch=4) | kw))


# The MLP configs below are shared between tests where what they check allows it: a cell's
# program is compiled once per process (config, call width), so the tests reuse each other's
# compiles. Five steps, logged every 2: steps 0, 2 and 4, the last a partial chunk.
NVFP4 = mlp(recipe="nvfp4", steps=5)  # stochastic rounding on the gradients
NVFP4_LOGGED = NVFP4.replace(telemetry_every=2)
MXFP4 = mlp(recipe="mxfp4", steps=5)  # RNE everywhere, no random signs


def run(cfg: Config, seeds):
    return sweep.compute_cell(cfg.to_dict(), seeds)


def assert_same(a: dict, b: dict):
    """Bit-identical summaries, series and telemetry (NaN == NaN)."""
    for part in ("series", "telemetry"):
        fa, fb = jax.tree.leaves_with_path(a[part]), jax.tree.leaves_with_path(b[part])
        assert [p for p, _ in fa] == [p for p, _ in fb]
        for (path, x), (_, y) in zip(fa, fb, strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(path))
    sa = {k: v for k, v in a["summary"].items() if k != "compile_s"}
    sb = {k: v for k, v in b["summary"].items() if k != "compile_s"}
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k] == sb[k] or (sa[k] != sa[k] and sb[k] != sb[k]), k


# ---------------------------------------------------------------------------------------------
# Config.


def test_config_round_trips_through_json_and_hashes():
    c = Config(recipe="nvfp4", gemms={"wgrad": "bf16"}, rules=[("lm_head", "bf16")])
    c = c.replace(phases=[(0.9, {"gemms": {"fprop": "bf16"}})])
    d = c.to_dict()
    assert Config.from_dict(d) == c and hash(Config.from_dict(d)) == hash(c)
    assert d["gemms"] == [["wgrad", "bf16"]]


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(recipe="nvfp5"), "Config.recipe='nvfp5'; allowed: 'fp32', 'bf16'"),
        (dict(lr="0.1"), "Config.lr='0.1' (str); must be float"),
        (dict(steps=2.5), "Config.steps=2.5 (float); must be int"),
        (dict(optimizer="adam"), "Config.optimizer='adam'; allowed: 'adamw', 'sgd'"),
        (
            dict(gemms={"wgrd": "bf16"}),
            "Config.gemms key='wgrd'; allowed: 'fprop', 'dgrad', 'wgrad'",
        ),
        (dict(rules=[("(", "bf16")]), "is not a regex"),
        (dict(phases=[(0.5, {"recipes": "bf16"})]), "unknown keys ['recipes']"),
        (dict(phases=[(300, "bf16")], steps=200), "must increase and be < steps=200"),
        (dict(shadow=True), "shadow=True needs telemetry_every"),
        (dict(target_on="eval"), "Config.target_on='eval'; allowed: 'train', 'hp'"),
        (dict(lr2=1.0), "unknown config fields ['lr2']; allowed: task,"),
    ],
)
def test_config_errors_name_field_value_and_allowed(bad, message):
    with pytest.raises(ConfigError) as e:
        make(bad)
    assert message in str(e.value)


def test_phase_rules_switch_recipes():
    cfg = Config(recipe="nvfp4", rules=[("lm_head", "bf16")], steps=100)
    cfg = cfg.replace(phases=[(0.5, {"gemms": {"wgrad": "bf16"}}), (90, "bf16")])
    phases = train.phase_rules(cfg)
    assert [(a, b) for a, b, _ in phases] == [(0, 50), (50, 90), (90, 100)]
    first, second, last = (rules for _, _, rules in phases)
    assert first[0].path == "lm_head" and first[-1].recipe.name == "nvfp4"
    assert second[-1].recipe.name == "nvfp4+wgrad=bf16"
    assert second[-1].recipe.wgrad_dy.elem == "bf16" and second[-1].recipe.fprop_x.elem == "e2m1"
    assert len(last) == 1 and last[0].recipe.name == "bf16"  # a bare name switches everything


# ---------------------------------------------------------------------------------------------
# Determinism and streams.


def test_same_cell_twice_is_bit_identical():
    cfg = NVFP4_LOGGED  # stochastic rounding and telemetry: every stream and the statistics
    a = run(cfg, [(0, 0, 0)])
    sweep.clear_cache()  # a fresh compile, too
    b = run(cfg, [(0, 0, 0)])
    assert_same(a[0], b[0])
    assert len(a[0]["telemetry"]["metrics"]) > 0


def test_telemetry_changes_no_number_and_matches_the_shadow_runs_statistics():
    # without the shadow the trainer measures in the one step body, under a lax.cond on the
    # step; with it, in a measured body of its own: the same statistics, the same training
    seeds = [(0, 1, 2)]
    off = run(NVFP4, seeds)[0]
    on = run(NVFP4_LOGGED, seeds)[0]
    shadow = run(NVFP4_LOGGED.replace(shadow=True), seeds)[0]
    for run_ in (on, shadow):
        for k, v in off["series"].items():
            np.testing.assert_array_equal(run_["series"][k], v, err_msg=k)
        assert run_["summary"]["eval_loss"] == off["summary"]["eval_loss"]
    got, want = on["telemetry"], shadow["telemetry"]
    assert list(got["steps"]) == list(want["steps"]) == [0, 2, 4]
    assert set(got["metrics"]) == {k for k in want["metrics"] if k.startswith(("quant/", "depth/"))}
    for k, v in got["metrics"].items():
        np.testing.assert_array_equal(v, want["metrics"][k], err_msg=k)
        if k.endswith("wgrad/dy/rel_err"):
            assert np.all(np.asarray(v) > 0.01), k  # measured at every logged step, not zeros


def test_seed_alone_equals_seed_in_a_batch_of_four():
    cfg = NVFP4_LOGGED  # stochastic rounding: the quant stream is used
    alone = run(cfg, [(3, 4, 5)])
    batch = run(cfg, [(0, 0, 0), (3, 4, 5), (1, 2, 3), (7, 7, 7)])
    assert_same(alone[0], batch[1])
    assert not np.array_equal(batch[0]["series"]["loss"], batch[1]["series"]["loss"])


def test_quant_stream_changes_nothing_without_stochastic_rounding():
    # one seed a call: the program of one seed, which the other tests compile too (a seed
    # alone equals it in a batch: test_seed_alone_equals_seed_in_a_batch_of_four)
    a, b = (run(MXFP4, [s])[0] for s in [(0, 0, 0), (0, 0, 1)])
    assert_same(a, b)
    a, b = (run(NVFP4, [s])[0] for s in [(0, 0, 0), (0, 0, 1)])
    assert not np.array_equal(a["series"]["loss"][1:], b["series"]["loss"][1:])
    assert a["series"]["loss"][0] == b["series"]["loss"][0]  # the forward uses RNE only


def test_data_stream_changes_batches_not_init_and_vice_versa():
    task = train.make_task(tiny())
    k00, k01, k10 = train.make_keys(0, 0, 0), train.make_keys(0, 1, 0), train.make_keys(1, 0, 0)
    p = {
        name: nnx.state(train.init_model(task, keys), nnx.Param)
        for name, keys in (("00", k00), ("01", k01), ("10", k10))
    }
    same = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), p["00"], p["01"])
    assert all(jax.tree.leaves(same))
    kernels = lambda state: [v for path, v in nnx.to_flat_state(state) if "kernel" in path]  # noqa: E731
    changed = [
        not jnp.array_equal(a[...], b[...])
        for a, b in zip(*map(kernels, (p["00"], p["10"])), strict=True)
    ]
    assert changed and all(changed)  # RMSNorm scales start at 1 whatever the seed
    assert not jnp.array_equal(train.train_batch(task, k00, 0), train.train_batch(task, k01, 0))
    assert jnp.array_equal(train.train_batch(task, k00, 0), train.train_batch(task, k10, 0))
    assert not jnp.array_equal(train.train_batch(task, k00, 0), train.train_batch(task, k00, 1))
    assert not jnp.array_equal(train.train_batch(task, k00, 0), train.eval_batch(task, k00, 0))


def test_equal_integers_in_two_streams_give_independent_keys():
    keys = train.make_keys(0, 0, 0)
    bits = [jax.random.bits(keys[s], (4,)) for s in ("init", "data", "quant")]
    assert len({tuple(np.asarray(b).tolist()) for b in bits}) == 3


# ---------------------------------------------------------------------------------------------
# End to end on each model, the floor, divergence, loss scaling.


@pytest.mark.parametrize("task", ["markov", "teacher", "text"])
def test_two_steps_end_to_end(task, tmp_path):
    extra = {}
    if task == "text":
        path = tmp_path / "tiny.txt"
        path.write_text("the quick brown fox jumps over the lazy dog. " * 20)
        extra = dict(text_path=str(path))
    if task == "teacher":  # the quantized recipe where it compiles fast
        cfg = mlp(steps=2, recipe="nvfp4", outlier_channels=2, telemetry_every=1, shadow=True)
    else:
        cfg = tiny(task=task, steps=2, recipe="bf16", telemetry_every=1, **extra)
    (out,) = run(cfg, [(0, 0, 0)])
    assert out["series"]["loss"].shape == (2,)
    assert np.all(np.isfinite(out["series"]["loss"]))
    keys = out["telemetry"]["metrics"].keys()
    assert any(k.startswith("quant/") and k.endswith("/wgrad/dy/rel_err") for k in keys)
    assert any(k.startswith("grad/") and k.endswith("/gnr") for k in keys) == cfg.shadow
    assert out["telemetry"]["metrics"][next(iter(keys))].shape == (2,)
    floor = out["summary"]["loss_floor"]
    assert {"teacher": floor == 0.0, "markov": floor > 0, "text": math.isnan(floor)}[task]


@pytest.mark.slow  # convergence
def test_training_approaches_the_entropy_floor():
    cfg = Config(
        **(TINY | dict(vocab=16, n_heads=2, d_model=32)),
        steps=400,
        lr=1e-2,
        warmup=10,
        eval_batches=32,
        seed_batch=1,
        target_gap=0.05,
    )
    (out,) = run(cfg, [(0, 0, 0)])
    s = out["summary"]
    start_gap = out["series"]["loss"][0] - s["loss_floor"]
    assert s["loss_floor"] > 0.5 and start_gap > 1.0
    assert -0.02 < s["loss_gap"] < 0.06, s  # a held-out estimate (its error ~0.015) may dip below 0
    assert math.isfinite(s["tokens_to_target"]) and s["tokens_to_target"] % 128 == 0


def test_divergence_is_recorded_not_raised():
    cfg = mlp(optimizer="sgd", lr=1e3, momentum=0.0, clip_norm=0.0, steps=12, schedule="constant")
    (out,) = run(cfg, [(0, 0, 0)])
    s = out["summary"]
    assert s["diverged"] and s["divergence_kind"] in ("nonfinite", "spike")
    cfg = cfg.replace(stop_on_divergence=True)
    (out,) = run(cfg, [(0, 0, 0)])
    k = int(out["summary"]["divergence_step"])
    assert np.all(np.isnan(out["series"]["loss"][k + 1 :]))


def test_spike_detection_over_running_median():
    cfg = tiny(steps=12, spike_window=3, spike_factor=1.0001, schedule="constant", lr=3e-2)
    (out,) = run(cfg, [(0, 0, 0)])
    loss = out["series"]["loss"]
    s = out["summary"]

    # the first step whose loss exceeds 1.0001 x the median of the 3 before it, or (from step 1
    # on, whatever the history) 1.0001 x the first loss
    def spike(t):
        return loss[t] > 1.0001 * loss[0] or (
            t >= 3 and loss[t] > 1.0001 * np.median(loss[t - 3 : t])
        )

    expect = next((t for t in range(1, len(loss)) if spike(t)), None)
    assert (s["divergence_step"] if s["diverged"] else None) == expect
    if expect is not None:
        assert s["divergence_kind"] == "spike"


def test_dynamic_loss_scaling_backs_off_on_overflow_and_grows():
    cfg = mlp(recipe="fp16", loss_scaling="dynamic", loss_scale=2.0**24, growth_interval=2)
    cfg = cfg.replace(steps=16)
    (out,) = run(cfg, [(0, 0, 0)])
    scale = out["series"]["loss_scale"]
    assert scale[0] == 2.0**24
    backed_off = np.flatnonzero(np.diff(scale) < 0)
    assert len(backed_off) > 0 and np.all(scale[backed_off + 1] == scale[backed_off] / 2)
    assert np.all(np.isfinite(out["series"]["loss"]))  # overflowing steps are skipped
    grew = np.flatnonzero(np.diff(scale) > 0)
    assert len(grew) > 0 and np.all(scale[grew + 1] == 2 * scale[grew])


def test_static_loss_scaling_unscales_gradients():
    base = mlp(recipe="fp32")  # the trainer's scaling, whatever the model: the fast-compiling MLP
    (a,) = run(base, [(0, 0, 0)])
    (b,) = run(base.replace(loss_scaling="static", loss_scale=1024.0), [(0, 0, 0)])
    np.testing.assert_allclose(a["series"]["grad_norm"], b["series"]["grad_norm"], rtol=1e-5)


def test_a_phase_switch_runs_and_changes_the_trajectory():
    cfg = MXFP4
    (a,) = run(cfg, [(0, 0, 0)])
    (b,) = run(cfg.replace(phases=[(2, "fp32")]), [(0, 0, 0)])
    np.testing.assert_array_equal(a["series"]["loss"][:2], b["series"]["loss"][:2])
    assert a["series"]["loss"][2] != b["series"]["loss"][2]  # step 2 runs in fp32


def test_tokens_to_target_on_hand_made_curves():
    loss = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 1.0])
    assert train.tokens_to_target(loss, 3.0, 1, 10) == 30.0  # step 2 reaches it: 3 steps
    assert train.tokens_to_target(loss, 2.5, 2, 10) == 40.0  # mean(3, 2) = 2.5 after step 3
    assert math.isnan(train.tokens_to_target(loss, 0.5, 1, 10))  # never
    assert math.isnan(train.tokens_to_target(loss, math.nan, 1, 10))  # no target
    assert math.isnan(train.tokens_to_target(np.array([np.nan, 0.1]), 1.0, 2, 10))
