"""Telemetry: exact statistics, the gradient channel, shadow gradients, zero cost when off."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import fp4lab as fl
from fp4lab.core import recipes
from fp4lab.nnx import telemetry
from fp4lab.nnx.rules import Rule, quantize_model
from fp4lab.ops.dot_general import qdot_general

STAT = {s: i for i, s in enumerate(telemetry.STATS)}


def test_statistics_are_exact_on_constructed_inputs():
    # one 1x16 MXFP4-like block with an FP32 block scale: s_b = amax / 6 = 1.
    spec = fl.QuantSpec(elem="e2m1", tile=(1, 16), block_scale="fp32", outer="none")
    x = jnp.array(
        [[6.0, 0.2, -0.2, 0.2, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]]
    )
    x_hat, s = telemetry.operand_stats(x, spec)
    # 0.2 -> 0 (flushed: 3 of 16 nonzero), everything else on the grid
    np.testing.assert_array_equal(x_hat[0, 1:4], 0.0)
    assert float(s[STAT["flush"]]) == 3 / 16
    err = np.asarray(x_hat - x, np.float64)
    np.testing.assert_allclose(
        float(s[STAT["rel_err"]]), np.linalg.norm(err) / np.linalg.norm(np.asarray(x)), rtol=1e-6
    )
    np.testing.assert_allclose(
        float(s[STAT["bias"]]), err.mean() / np.abs(np.asarray(x)).mean(), rtol=1e-6
    )
    assert float(s[STAT["saturated"]]) == 0.0 and float(s[STAT["underflow"]]) == 0.0


@pytest.mark.parametrize(
    "spec, amax, cols",
    [
        (fl.nvfp4(), None, 64),
        (fl.nvfp4(tile=(16, 16)), None, 64),
        (fl.nvfp4(four_over_six="mae", transform=fl.Hadamard(16, "random")), None, 64),
        (fl.nvfp4(scope="row", rounding="stochastic"), None, 64),
        (fl.mxfp4(pad=True), None, 40),
        (fl.fp8("e4m3"), 5.0, 64),
        (fl.cast_spec("bf16"), None, 64),
    ],
)
def test_x_hat_is_the_quantizers_own(spec, amax, cols):
    # operand_stats works on the quantizer's blocks; its x_hat must be quantize's, bit for bit
    x = 3.0 * jax.random.normal(jax.random.key(3), (16, cols))
    x = x.at[1].set(0.0).at[2, 5].set(1e-30)  # an all-zero row and a value that flushes
    kw = dict(key=jax.random.key(1), amax=None if amax is None else jnp.float32(amax))

    @jax.jit  # one compile, not one per operation as eagerly
    def both(x, kw):
        x_hat, _ = telemetry.operand_stats(x, spec, **kw)
        return x_hat, fl.quantize(x, spec, **kw).dequantize(rotated=True)

    x_hat, expected = both(x, kw)
    np.testing.assert_array_equal(x_hat, expected)


def test_saturation_and_underflow_fractions():
    # FP8 E4M3 with a delayed (too small) amax: everything above 448 * amax/448 saturates
    spec = fl.fp8("e4m3")
    x = jnp.linspace(1.0, 8.0, 64).reshape(1, 64)
    q = fl.quantize(x, spec, amax=jnp.float32(4.0))  # stale amax: values above 4 clip
    deq = q.dequantize()
    assert float(jnp.max(deq)) == pytest.approx(4.0)
    # operand_stats with current scaling: nothing saturates
    _, s = telemetry.operand_stats(x, spec)
    assert float(s[STAT["saturated"]]) == 0.0
    # NVFP4 without an outer scale: a block of tiny values underflows its E4M3 scale
    spec = fl.QuantSpec(outer="none")  # NVFP4 blocks with no second-level scale
    tiny = jnp.concatenate([jnp.full((1, 16), 1e-6), jnp.ones((1, 16))], axis=1)
    x_hat, s = telemetry.operand_stats(tiny, spec)
    np.testing.assert_array_equal(x_hat[0, :16], 0.0)
    assert float(s[STAT["underflow"]]) == 0.5
    assert float(s[STAT["flush"]]) == 0.5


def test_saturated_counts_elements_clipped_to_the_block_maximum():
    # E4M3 per-tensor cast without a scale: values above 448 clip
    spec = fl.QuantSpec(elem="e4m3", tile=None, block_scale=None, outer="none")
    x = jnp.array([[100.0, 500.0, 1000.0, -600.0]])
    _, s = telemetry.operand_stats(x, spec)
    assert float(s[STAT["saturated"]]) == 3 / 4


def test_map4_fraction_for_four_over_six():
    spec = fl.nvfp4(four_over_six="mae")
    x = jax.random.normal(jax.random.key(0), (8, 64))
    _, s = telemetry.operand_stats(x, spec)
    frac = float(s[STAT["map4"]])
    assert 0.0 < frac < 1.0


def _xw():
    x = jax.random.normal(jax.random.key(0), (32, 64))
    w = jax.random.normal(jax.random.key(1), (64, 32))
    return x, w


DN = (((1,), (0,)), ((), ()))


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4-h16"])
def test_backward_statistics_through_the_channel_equal_direct_ones(name, documented_keys):
    recipe = recipes.get(name)
    x, w = _xw()
    key = jax.random.key(4)
    probe = jnp.zeros((4, len(telemetry.STATS)))
    g = jax.random.normal(jax.random.key(5), (32, 32))

    def f(x, w, probe):
        y, _ = qdot_general(x, w, DN, recipe, key=key, probe=probe)
        return jnp.sum(y * g)

    _, _, bstats = jax.grad(f, (0, 1, 2))(x, w, probe)
    ks = documented_keys(key)
    kd, kw = ks["dgrad_transform"], ks["wgrad_transform"]
    td, tw = recipe.transform("dgrad"), recipe.transform("wgrad")
    direct = [
        telemetry.operand_stats(
            g[None],
            recipe.dgrad_dy.replace(axis=2, transform=td),
            key=ks["dgrad_dy"],
            transform_key=kd,
        )[1],
        telemetry.operand_stats(
            w.T[None],
            recipe.dgrad_w.replace(axis=1, transform=td),
            key=ks["dgrad_w"],
            transform_key=kd,
        )[1],
        telemetry.operand_stats(
            x[None],
            recipe.wgrad_x.replace(axis=1, transform=tw),
            key=ks["wgrad_x"],
            transform_key=kw,
        )[1],
        telemetry.operand_stats(
            g[None],
            recipe.wgrad_dy.replace(axis=1, transform=tw),
            key=ks["wgrad_dy"],
            transform_key=kw,
        )[1],
    ]
    _assert_same_stats(bstats, jnp.stack(direct))
    assert float(bstats[0, STAT["rel_err"]]) > 0.01


def _assert_same_stats(got, want):
    """Fractions (counts) exactly; the float reductions up to their summation order."""
    counts = [STAT[s] for s in ("flush", "saturated", "underflow", "map4")]
    np.testing.assert_array_equal(np.asarray(got)[:, counts], np.asarray(want)[:, counts])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-8)


def test_forward_statistics_equal_direct_ones():
    recipe = recipes.get("nvfp4-rl")
    x, w = _xw()
    _, fstats = qdot_general(x, w, DN, recipe, probe=jnp.zeros((4, len(telemetry.STATS))))
    sx = telemetry.operand_stats(x[None], recipe.fprop_x.replace(axis=2))[1]
    sw = telemetry.operand_stats(w.T[None], recipe.fprop_w.replace(axis=2))[1]
    _assert_same_stats(fstats, jnp.stack([sx, sw]))


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


def test_fp32_recipe_gives_perfect_shadow_and_zero_fractions():
    # Compiled, as in training: eagerly, lax's own transpose rule dispatches a differently
    # laid-out CPU dot than the compiled VJP, and on some CPUs the last bits differ.
    model = MLP(nnx.Rngs(0))
    quantize_model(model, [Rule(r".*", "fp32")], telemetry=True)
    x, y = _data()

    @nnx.jit
    def measure(model):
        _, grads, metrics = telemetry.value_and_grad(_loss)(model, x, y)
        exact = telemetry.exact_grads(_loss, model, x, y)
        return metrics, telemetry.shadow_metrics(grads, exact)

    metrics, shadow = measure(model)
    for k, v in shadow.items():
        if k.endswith("/cos") or k.endswith("/rel_norm"):
            assert float(v) == pytest.approx(1.0, abs=1e-6), k
        if k.endswith("/gnr"):
            assert math.isinf(float(v)), k
    assert {k: float(v) for k, v in metrics.items() if k.startswith("depth/")} == {
        "depth/up": 0.0,  # the layers in the forward's order
        "depth/down": 1.0,
    }
    for k, v in metrics.items():
        if not k.startswith("depth/"):
            assert float(v) == 0.0, k


def test_nvfp4_shadow_metrics_are_sensible():
    model = MLP(nnx.Rngs(0))
    quantize_model(model, [Rule(r".*", "nvfp4")], key=jax.random.key(0), telemetry=True)
    x, y = _data()

    @nnx.jit  # compiled, as in training (and one compile, not one per operation)
    def measure(model):
        _, grads, _ = telemetry.value_and_grad(_loss)(model, x, y)
        return telemetry.shadow_metrics(grads, telemetry.exact_grads(_loss, model, x, y))

    shadow = measure(model)
    cos = float(shadow["grad/up.kernel/cos"])
    gnr = float(shadow["grad/up.kernel/gnr"])
    assert 0.5 < cos < 1.0
    assert 0.0 < gnr < math.inf
    assert bool(shadow["grad/up.kernel/below_sqrt3"]) == (gnr < math.sqrt(3))


def _train(measure: bool, steps=3):
    model = MLP(nnx.Rngs(0))
    quantize_model(model, [Rule(r".*", "nvfp4")], key=jax.random.key(0), telemetry=measure)
    import optax

    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    x, y = _data()

    @nnx.jit
    def step(model, opt):
        if measure:
            loss, grads, metrics = telemetry.value_and_grad(_loss)(model, x, y)
        else:
            loss, grads = nnx.value_and_grad(_loss)(model, x, y)
        opt.update(model, grads)
        return loss

    losses = [step(model, opt) for _ in range(steps)]
    return np.asarray(losses), nnx.state(model, nnx.Param)


def test_telemetry_does_not_change_the_training_result():
    l0, p0 = _train(False)
    l1, p1 = _train(True)
    np.testing.assert_array_equal(l0, l1)
    for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p1), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_traced_flag_measures_where_it_holds_and_changes_no_gradient():
    # `when`: one compiled step for the steps with statistics and those without (the trainer's)
    model = MLP(nnx.Rngs(0))
    quantize_model(model, [Rule(r".*", "nvfp4")], key=jax.random.key(0), telemetry=True)
    x, y = _data()

    @nnx.jit
    def flagged(model, flag):
        return telemetry.value_and_grad(_loss, when=flag)(model, x, y)

    @nnx.jit
    def always(model):
        return telemetry.value_and_grad(_loss)(model, x, y)

    @nnx.jit
    def plain(model):
        return nnx.value_and_grad(_loss, argnums=nnx.DiffState(0, nnx.Param))(model, x, y)

    # each call draws the next quantization keys: every variant starts from the same state
    loss_on, grads_on, on = flagged(nnx.clone(model), jnp.bool_(True))
    loss_off, grads_off, off = flagged(nnx.clone(model), jnp.bool_(False))
    loss_a, grads_a, want = always(nnx.clone(model))
    loss_p, grads_p = plain(nnx.clone(model))
    assert sorted(on) == sorted(off) == sorted(want) == sorted(telemetry.metric_keys(model))
    for k in want:  # the same statistics, computed in the lax.cond's branch
        np.testing.assert_array_equal(on[k], want[k], err_msg=k)
        expected = want[k] if k.startswith("depth/") else 0.0
        np.testing.assert_array_equal(off[k], expected, err_msg=k)
    assert float(want["quant/up/wgrad/dy/rel_err"]) > 0.01
    for loss in (loss_on, loss_off, loss_a):
        np.testing.assert_array_equal(loss, loss_p)
    for grads in (grads_on, grads_off, grads_a):
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_p), strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="does not apply with shadow=True"):
        telemetry.value_and_grad(_loss, shadow=True, when=jnp.bool_(True))


def test_logging_every_k_steps_costs_nothing_between_logs():
    import optax

    def run(log_every):
        model = MLP(nnx.Rngs(0))
        quantize_model(
            model, [Rule(r".*", "nvfp4")], key=jax.random.key(0), telemetry=log_every is not None
        )
        opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
        x, y = _data()

        @nnx.jit
        def step(model, opt):
            loss, grads, metrics = telemetry.value_and_grad(_loss)(model, x, y)
            opt.update(model, grads)
            return loss, metrics

        losses, logged = [], []
        for i in range(4):
            if log_every is not None:
                telemetry.set_enabled(model, i % log_every == 0)
            loss, metrics = step(model, opt)
            losses.append(float(loss))
            logged.append(len(metrics))
        return losses, logged, nnx.state(model, nnx.Param)

    l0, m0, p0 = run(None)
    l2, m2, p2 = run(2)
    assert l0 == l2 and m0 == [0, 0, 0, 0]
    assert m2[0] > 0 and m2[1] == 0 and m2[2] == m2[0] and m2[3] == 0
    for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p2), strict=True):
        np.testing.assert_array_equal(a, b)
