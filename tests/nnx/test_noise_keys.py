"""The zero-mean part of the gradient's quantization noise (`Config.noise_keys`,
`fp4lab.nnx.noise`): the statistics against draws and formulas computed here, deterministic
recipes, the scanned LM, the trainer's trajectory unchanged, and the config's checks."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from fp4lab import sweep
from fp4lab.models import Transformer, TransformerConfig
from fp4lab.nnx import noise, telemetry
from fp4lab.nnx.op import QuantizedOp
from fp4lab.nnx.rules import Rule, quantize_model
from fp4lab.schema import GRAD_NOISE_STATS, GRAD_STATS
from fp4lab.sweep import store
from fp4lab.train.config import Config, ConfigError, make

MLP_TASK = dict(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,))


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.up = nnx.Linear(64, 128, rngs=rngs)
        self.down = nnx.Linear(128, 32, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.relu(self.up(x)))


def _loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def _data():
    x = jax.random.normal(jax.random.key(7), (32, 64))
    y = jax.random.normal(jax.random.key(8), (32, 32))
    return x, y


def _model(recipe: str):
    model = MLP(nnx.Rngs(0))
    return quantize_model(model, [Rule(r".*", recipe)], key=jax.random.key(0), telemetry=True)


def _measure(model, keys: int):
    """(g_q, g, metrics) of one shadow step with `keys` noise draws, compiled."""
    x, y = _data()

    @nnx.jit
    def step(model):
        _, grads, metrics = telemetry.value_and_grad(_loss, shadow=True, noise_keys=keys)(
            model, x, y
        )
        return grads, telemetry.exact_grads(_loss, model, x, y), metrics

    return step(model)


def _flat(grads) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, np.float64) for k, v in telemetry.layer_arrays(grads).items()}


def _draw_here(model, k: int) -> dict[str, np.ndarray]:
    """Draw k written out with jax.random: every op's base key b becomes
    fold_in(fold_in(b, NOISE_TAG), k) on a clone; the clone's plain Param gradient."""
    clone = telemetry.set_enabled(nnx.clone(model), False)
    for _, op in nnx.iter_modules(clone):
        if isinstance(op, QuantizedOp) and op.qbase is not None:
            base = jax.random.fold_in(op.qbase[...], np.uint32(noise.NOISE_TAG))
            op.qbase[...] = jax.random.fold_in(base, np.uint32(k))
    return _flat(_plain_grad(clone, *_data()))


@nnx.jit  # one compile for every draw of both tests below
def _plain_grad(model, x, y):
    return nnx.grad(_loss, argnums=nnx.DiffState(0, nnx.Param))(model, x, y)


def test_stochastic_rounding_statistics_match_draws_computed_here():
    keys = 4
    model = _model("nvfp4")  # stochastic rounding of the gradients (dgrad_dy, wgrad_dy)
    grads_q, exact, metrics = _measure(nnx.clone(model), keys)
    draws = [_draw_here(model, k) for k in range(keys)]
    g, g_q = _flat(exact), _flat(grads_q)
    for layer in ("up.kernel", "down.kernel", "up.bias"):
        d = np.stack([draw[layer].ravel() for draw in draws])  # (K, n), float64
        assert not np.array_equal(d[0], g_q[layer].ravel())  # not the run's own draw
        assert not np.array_equal(d[0], d[1])
        mean = d.mean(axis=0)
        zm = math.sqrt(((d - mean) ** 2).sum() / (keys - 1))
        bias = math.sqrt(max(((mean - g[layer].ravel()) ** 2).sum() - zm**2 / keys, 0.0))
        got = {s: float(metrics[f"grad/{layer}/{s}"]) for s in GRAD_NOISE_STATS}
        assert got["noise_zm"] > 0, layer
        # float32 sums against float64 ones on the same draws (measured: < 1e-7 relative);
        # K - 1 for K, or the bias without its -noise_zm**2 / K, would be off by 1-15 %
        assert got["noise_zm"] == pytest.approx(zm, rel=1e-6), layer
        assert got["noise_bias"] == pytest.approx(bias, rel=1e-6), layer
        norm = np.linalg.norm(g[layer])
        assert got["gnr_zm"] == pytest.approx(norm / zm, rel=1e-6), layer
    # the forward rounds to nearest: the last layer's bias gradient is the loss's own dy
    assert float(metrics["grad/down.bias/noise_zm"]) == 0.0


def test_the_draws_are_the_documented_keys_and_leave_the_model_alone():
    model = _model("nvfp4")
    before = nnx.state(model)
    x, y = _data()
    draws = nnx.jit(lambda m: noise.draw_gradients(_loss, m, (x, y), {}, keys=3))(model)
    here = [_draw_here(model, k) for k in range(3)]
    first, s1 = _flat(draws.first), _flat(draws.shift_sum)
    for layer, want in here[0].items():
        np.testing.assert_allclose(first[layer], want, rtol=1e-5, atol=1e-7, err_msg=layer)
        shift = sum(h[layer] - here[0][layer] for h in here)
        scale = np.abs(want).max()
        np.testing.assert_allclose(s1[layer], shift, atol=1e-5 * scale, err_msg=layer)
    for a, b in zip(_leaves(before), _leaves(nnx.state(model)), strict=True):
        np.testing.assert_array_equal(a, b)  # keys, call counters, parameters, statistics


def _leaves(state) -> list[np.ndarray]:
    def raw(a):
        return jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a

    return [np.asarray(raw(a)) for a in jax.tree.leaves(state)]


@pytest.mark.parametrize("recipe", ["nvfp4-no-sr", "mxfp4"])
def test_a_deterministic_recipe_has_no_zero_mean_noise(recipe):
    keys = 3  # not a power of two: a mean of equal draws that rounded would show here
    grads_q, exact, metrics = _measure(_model(recipe), keys)
    g, g_q = _flat(exact), _flat(grads_q)
    for layer in g:
        assert float(metrics[f"grad/{layer}/noise_zm"]) == 0.0, layer
        assert math.isinf(float(metrics[f"grad/{layer}/gnr_zm"])), layer
        # the draws and the run's g_q are the same rounding in two compiled passes, norms in
        # float32 against float64 here: equal to 1e-6 relative (measured: < 1e-7)
        total = np.linalg.norm(g_q[layer] - g[layer])
        got = float(metrics[f"grad/{layer}/noise_bias"])
        assert got == pytest.approx(total, rel=1e-6), layer
        gnr = float(metrics[f"grad/{layer}/gnr"])  # ||g|| / ||g_q - g||, the run's own
        assert got == pytest.approx(np.linalg.norm(g[layer]) / gnr, rel=1e-6), layer


def test_scanned_lm_is_measured_per_layer():
    cfg = dict(vocab=16, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=16)
    model = Transformer(TransformerConfig(**cfg, scan_layers=True), rngs=nnx.Rngs(0))
    rules = [Rule(r".*attn\.query", "nvfp4"), Rule(r".*", None)]  # compiles in seconds
    model = quantize_model(model, rules, key=jax.random.key(1), telemetry=True)
    tokens = jax.random.randint(jax.random.key(0), (8, 17), 0, 16)

    def lm_loss(model, tokens):
        logits = model(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    @nnx.jit
    def step(model):
        _, _, m = telemetry.value_and_grad(lm_loss, shadow=True, noise_keys=2)(model, tokens)
        return m, telemetry.exact_grads(lm_loss, model, tokens)

    m, exact = step(model)
    g = telemetry.layer_arrays(exact, telemetry.stacked_layers(model))
    gnr = {k.rsplit("/", 1)[0] for k in m if k.startswith("grad/") and k.endswith("/gnr")}
    for stat in GRAD_NOISE_STATS:
        assert {k.rsplit("/", 1)[0] for k in m if k.endswith(f"/{stat}")} == gnr, stat
    for i in (0, 1):
        layer = f"blocks.{i}.attn.query.kernel"
        zm = float(m[f"grad/{layer}/noise_zm"])
        assert 0 < zm < math.inf
        norm = float(np.linalg.norm(np.asarray(g[layer], np.float64)))  # this layer's slice
        assert float(m[f"grad/{layer}/gnr_zm"]) == pytest.approx(norm / zm, rel=1e-5)
    q0, q1 = (float(m[f"grad/blocks.{i}.attn.query.kernel/noise_zm"]) for i in (0, 1))
    assert q0 != q1
    assert not any(k.startswith("grad/blocks.attn") for k in m)  # never the stack as one


# ---------------------------------------------------------------------------------------------
# The trainer and the config.


# with recipe="nvfp4", telemetry_every=2 and shadow=True, a cell of tests/train/test_train.py
# and tests/nnx/test_drift.py too: its program compiles once for the three files
def _cell(**kw):
    cfg = Config(**(MLP_TASK | dict(batch_size=32, steps=5, eval_batches=1, seed_batch=4) | kw))
    return sweep.compute_cell(cfg.to_dict(), [(0, 1, 2)])[0]


def test_the_draws_change_no_number_of_the_run():
    base = dict(recipe="nvfp4", telemetry_every=2, shadow=True)
    off, on = _cell(**base), _cell(**base, noise_keys=4)
    for k, v in off["series"].items():
        np.testing.assert_array_equal(on["series"][k], v, err_msg=k)
    summary = lambda out: {k: v for k, v in out["summary"].items() if k != "compile_s"}  # noqa: E731
    a, b = summary(off), summary(on)
    assert a.keys() == b.keys() and all(a[k] == b[k] or a[k] != a[k] for k in a)
    got, want = on["telemetry"], off["telemetry"]
    assert list(got["steps"]) == list(want["steps"]) == [0, 2, 4]
    added = {k for k in got["metrics"] if k.rsplit("/", 1)[-1] in GRAD_NOISE_STATS}
    assert set(got["metrics"]) - added == set(want["metrics"])
    for k, v in want["metrics"].items():
        np.testing.assert_array_equal(got["metrics"][k], v, err_msg=k)
    layers = {k.rsplit("/", 1)[0] for k in want["metrics"] if k.endswith("/gnr")}
    assert added == {f"{layer}/{s}" for layer in layers for s in GRAD_NOISE_STATS}
    assert not any(k.rsplit("/", 1)[-1] in GRAD_NOISE_STATS for k in want["metrics"])
    for layer in layers:
        if layer.endswith("kernel"):  # at every logged step
            assert np.all(np.asarray(got["metrics"][f"{layer}/noise_zm"]) > 0), layer


def test_the_noise_norms_are_in_the_losss_units_under_loss_scaling():
    base = dict(recipe="nvfp4", telemetry_every=2, shadow=True, noise_keys=2, steps=1)
    plain, scaled = _cell(**base), _cell(**base, loss_scaling="static", loss_scale=2.0**10)
    for k, v in plain["telemetry"]["metrics"].items():
        if k.rsplit("/", 1)[-1] in GRAD_NOISE_STATS + GRAD_STATS:
            np.testing.assert_allclose(scaled["telemetry"]["metrics"][k], v, rtol=1e-5, err_msg=k)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(noise_keys=-1), "Config.noise_keys=-1; allowed: an int >= 0"),
        (dict(noise_keys=1, shadow=True, telemetry_every=1), "Config.noise_keys=1; allowed: 0"),
        (dict(noise_keys=4), "Config.noise_keys=4 needs shadow=True"),
        (dict(noise_keys=4, telemetry_every=2), "Config.noise_keys=4 needs shadow=True"),
        (dict(noise_keys=2.0, shadow=True, telemetry_every=1), "must be int"),
    ],
)
def test_config_checks_noise_keys(bad, message):
    with pytest.raises(ConfigError) as e:
        make(bad)
    assert message in str(e.value)


def test_noise_keys_through_set_and_stored_run_ids():
    overrides = sweep.parse_overrides(["noise_keys=4", "shadow=true", "telemetry_every=5"])
    assert overrides["noise_keys"] == 4
    assert make(overrides).noise_keys == 4
    new = Config(**MLP_TASK, telemetry_every=5, shadow=True).to_dict()
    old = {k: v for k, v in new.items() if k != "noise_keys"}  # a record made before the field
    assert Config.from_dict(old).noise_keys == 0
    assert store.run_id(new, (0, 0, 0)) == store.run_id(old, (0, 0, 0))
    assert store.run_id(new | {"noise_keys": 4}, (0, 0, 0)) != store.run_id(new, (0, 0, 0))


def test_value_and_grad_checks_noise_keys():
    with pytest.raises(ValueError, match="noise_keys needs shadow=True"):
        telemetry.value_and_grad(_loss, noise_keys=2)
    with pytest.raises(ValueError, match="noise_keys=1; allowed: 0"):
        telemetry.value_and_grad(_loss, shadow=True, noise_keys=1)
