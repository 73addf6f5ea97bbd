"""Accumulated-drift telemetry: acc/<layer>/{fwd,bwd}/... against the high-precision shadow."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

import fp4lab as fl
from fp4lab.core import recipes
from fp4lab.nnx import telemetry
from fp4lab.schema import ACC_STATS, acc_key

D = 32


class Chain(nnx.Module):
    """n square Linear layers; `act` between them (None: a purely linear chain)."""

    def __init__(self, n: int, act=jnp.tanh, *, rngs: nnx.Rngs):
        self.layers = nnx.List([nnx.Linear(D, D, use_bias=False, rngs=rngs) for _ in range(n)])
        self.act = act

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
            x = x if self.act is None else self.act(x)
        return x


X = jax.random.normal(jax.random.key(2), (8, D))
V = jax.random.normal(jax.random.key(3), (8, D))


def _square_loss(model, x):
    return jnp.mean(model(x) ** 2)


def _linear_loss(model, x):  # its cotangent at the output is V, whatever the activations
    return jnp.sum(model(x) * V)


def _chain(n, recipe_of, act=jnp.tanh):
    model = Chain(n, act, rngs=nnx.Rngs(0))
    rules = [fl.Rule(rf"layers\.{i}", recipe_of(i)) for i in range(n)]
    return fl.quantize_model(model, rules, key=jax.random.key(1), telemetry=True)


@nnx.jit(static_argnums=(0, 3))
def _measure(loss_fn, model, x, shadow=True):
    return telemetry.value_and_grad(loss_fn, shadow=shadow)(model, x)


def _acc(metrics, n, direction, stat):
    return np.array([float(metrics[acc_key(f"layers.{i}", direction, stat)]) for i in range(n)])


def test_every_op_in_high_precision_drifts_by_exactly_zero():
    model = _chain(4, lambda i: "fp32")
    _, _, m = _measure(_square_loss, model, X)
    keys = {k for k in m if k.startswith("acc/")}
    assert keys == {
        acc_key(f"layers.{i}", d, s) for i in range(4) for d in ACC_STATS for s in ACC_STATS[d]
    }
    np.testing.assert_array_equal(_acc(m, 4, "fwd", "rel_drift"), 0.0)
    np.testing.assert_array_equal(_acc(m, 4, "fwd", "local"), 0.0)
    np.testing.assert_array_equal(_acc(m, 4, "bwd", "rel_drift"), 0.0)  # identical cotangents
    # and so a cosine of 1, up to the rounding of <a, a> / (||a|| ||a||) in float32: the dot
    # and the two norms are separate reductions, whose last bits the compiler may order apart
    np.testing.assert_allclose(_acc(m, 4, "bwd", "cos"), 1.0, rtol=0, atol=2**-22)


def test_forward_drift_starts_at_the_one_quantized_op_and_stays():
    model = _chain(4, lambda i: "nvfp4" if i == 2 else "fp32")
    _, _, m = _measure(_square_loss, model, X)
    fwd, local = _acc(m, 4, "fwd", "rel_drift"), _acc(m, 4, "fwd", "local")
    np.testing.assert_array_equal(fwd[:2], 0.0)
    assert (fwd[2:] > 0.01).all()
    np.testing.assert_array_equal(local[[0, 1, 3]], 0.0)  # only op 2 adds error of its own
    assert local[2] == fwd[2]  # op 2 is fed the shadow's own input: its drift is all local
    bwd = _acc(m, 4, "bwd", "rel_drift")
    assert (bwd > 0).all()  # tanh and the square loss: every cotangent sees the activations


def test_in_a_linear_chain_the_cotangents_above_the_quantized_op_do_not_drift():
    model = _chain(4, lambda i: "nvfp4" if i == 1 else "fp32", act=None)
    _, _, m = _measure(_linear_loss, model, X)
    bwd, cos = _acc(m, 4, "bwd", "rel_drift"), _acc(m, 4, "bwd", "cos")
    np.testing.assert_array_equal(bwd[1:], 0.0)  # ops 1-3: dy is V pulled back by fp32 ops
    # the same cotangents (bwd == 0 exactly); their cosine is 1 up to its own rounding, whose
    # last bit depends on the CPU's summation order (<a, a> against ||a||^2)
    np.testing.assert_allclose(cos[1:], 1.0, rtol=0, atol=2**-22)
    assert bwd[0] > 0.01 and cos[0] < 1.0  # below it: op 1's quantized Dgrad
    fwd = _acc(m, 4, "fwd", "rel_drift")
    np.testing.assert_array_equal(fwd[0], 0.0)
    assert (fwd[1:] > 0).all()


def _weights_only_nvfp4():
    return recipes.get("fp32").replace(fprop_w=fl.nvfp4())  # RNE, no rotation, no 4/6


def _nvfp4_diagonal_by_hand(d: np.ndarray) -> np.ndarray:
    """NVFP4 ("te") of diag(d) along its contraction axis, by docs/architecture.md §2.

    Each 16-block of a column holds one nonzero, d_j, so amax_b = d_j and x * e_b =
    d_j / (s_b * S_dec) is 6 up to the E4M3 rounding of s_b (at most 2^-4 relative): it
    rounds to 6 on the E2M1 grid, and x_hat = 6 * s_b * S_dec."""
    f32 = np.float32
    s_enc = f32(448 * 6) / f32(np.abs(d).max())
    s_dec = f32(1) / s_enc
    s_b = (d * (s_enc * (f32(1) / f32(6)))).astype(ml_dtypes.float8_e4m3fn).astype(f32)
    return f32(6) * s_b * s_dec


def test_drift_through_a_deep_linear_chain_is_the_product_of_per_op_errors():
    n = 6
    rng = np.random.default_rng(0)
    diags = [rng.uniform(0.5, 2.0, D).astype(np.float32) for _ in range(n)]
    model = _chain(n, lambda i: _weights_only_nvfp4(), act=None)
    for layer, d in zip(model.layers, diags, strict=True):
        layer.kernel[...] = jnp.diag(d)
    x = X.astype(jnp.float32)
    _, _, m = _measure(_square_loss, model, x)
    # by hand: y_k = x * prod_{i<=k} q(d_i) against x * prod_{i<=k} d_i (no activation quantized)
    ratio = np.ones(D)
    expected = []
    for d in diags:
        q = _nvfp4_diagonal_by_hand(d).astype(np.float64)
        ratio = ratio * q / d
        assert not np.allclose(q, d)  # every op errs
        exact = np.asarray(x, np.float64) * np.prod([dd for dd in diags[: len(expected) + 1]], 0)
        expected.append(np.linalg.norm(exact * (ratio - 1)) / np.linalg.norm(exact))
    np.testing.assert_allclose(_acc(m, n, "fwd", "rel_drift"), expected, rtol=1e-5)
    assert expected[-1] > expected[0]  # it accumulates


def _bits(a):
    a = jnp.asarray(a)
    return jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a


def test_the_step_is_bit_identical_with_the_shadow_on_or_off():
    def run(shadow):
        model = _chain(3, lambda i: "nvfp4")
        loss, grads, metrics = _measure(_square_loss, model, X, shadow)
        return loss, grads, metrics, nnx.state(model)

    on, off = run(True), run(False)
    assert jax.tree.structure(on[3]) == jax.tree.structure(off[3])  # no drift state left behind
    for a, b in [(on[0], off[0]), (on[1], off[1]), (on[3], off[3])]:
        jax.tree.map(lambda u, v: np.testing.assert_array_equal(_bits(u), _bits(v)), a, b)
    assert set(off[2]) <= set(on[2])
    for k in off[2]:
        np.testing.assert_array_equal(on[2][k], off[2][k], err_msg=k)
    assert any(k.startswith("acc/") for k in on[2]) and not any(
        k.startswith("acc/") for k in off[2]
    )


def test_drift_under_vmap_over_seeds_is_each_seeds_own():
    def measure(key):  # stochastic rounding: the quantization key is the seed
        model = Chain(3, rngs=nnx.Rngs(0))
        fl.quantize_model(model, [fl.Rule(".*", "nvfp4")], key=key, telemetry=True)
        return telemetry.value_and_grad(_square_loss, shadow=True)(model, X)[2]

    k0, k1, k2 = jax.random.split(jax.random.key(5), 3)
    run = jax.jit(jax.vmap(measure))  # seeds always run vmapped (fp4lab.sweep.compute_cell)
    a, b = run(jnp.stack([k0, k1])), run(jnp.stack([k1, k2]))
    assert any(k.startswith("acc/") for k in a)
    for k in a:
        np.testing.assert_array_equal(a[k][1], b[k][0], err_msg=k)
    assert not np.array_equal(a["acc/layers.0/bwd/cos"], b["acc/layers.0/bwd/cos"])


def test_the_trainer_logs_drift_every_k_steps_and_trains_the_same_without_it():
    from fp4lab import sweep
    from fp4lab.train import Config

    # the MLP (a compile of the scanned LM's shadow step costs minutes on two cores; the LM is
    # covered at the model level above), in the configs of tests/train/test_train.py's and
    # tests/nnx/test_noise_keys.py's MLP cells: the programs compile once for the three files
    # (in one process, or through the tests' compile cache); steps 0, 2 and 4 are logged
    base = dict(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,),
                batch_size=32, steps=5, eval_batches=1, recipe="nvfp4", telemetry_every=2,
                seed_batch=4)  # fmt: skip
    (on,) = sweep.compute_cell(Config(**base, shadow=True).to_dict(), [(0, 1, 2)])
    (off,) = sweep.compute_cell(Config(**base).to_dict(), [(0, 1, 2)])
    np.testing.assert_array_equal(on["series"]["loss"], off["series"]["loss"])
    assert on["summary"]["eval_loss"] == off["summary"]["eval_loss"]
    tele = on["telemetry"]
    assert list(tele["steps"]) == [0, 2, 4]
    drift = {k: v for k, v in tele["metrics"].items() if k.startswith("acc/")}
    assert {k.split("/")[1] for k in drift} == {
        k.split("/")[1] for k in tele["metrics"] if k.startswith("quant/")
    }
    assert all(len(v) == 3 and np.isfinite(v).all() for v in drift.values())
    assert not any(k.startswith("acc/") for k in off["telemetry"]["metrics"])
