"""quantize_model on unmodified nnx models: rules, describe, transforms."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import fp4lab as fl
from fp4lab.core import recipes
from fp4lab.nnx.op import QuantizedOp
from fp4lab.nnx.rules import Rule, describe, quantize_model, unmatched_rules, unquantize


class Block(nnx.Module):
    """A small pre-norm transformer block written with plain nnx layers (no fp4lab import)."""

    def __init__(self, d: int, heads: int, rngs: nnx.Rngs):
        self.norm1 = nnx.RMSNorm(d, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(
            num_heads=heads, in_features=d, qkv_features=d, decode=False, rngs=rngs
        )
        self.norm2 = nnx.RMSNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, 2 * d, rngs=rngs)
        self.down = nnx.Linear(2 * d, d, rngs=rngs)
        self.head = nnx.Einsum("btd,dv->btv", (d, 32), rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.norm1(x))
        x = x + self.down(jax.nn.gelu(self.up(self.norm2(x))))
        return self.head(x)


D, HEADS = 64, 2


def _model(seed=0):
    return Block(D, HEADS, nnx.Rngs(seed))


def _x(seed=1):
    return jax.random.normal(jax.random.key(seed), (2, 32, D))


def _fq_linear(x, layer, recipe):
    xq = fl.fake_quant(x, recipe.fprop_x.replace(axis=-1))
    wq = fl.fake_quant(layer.kernel[...], recipe.fprop_w.replace(axis=0))
    return xq @ wq + _bcast(layer.bias[...], xq.ndim)


def _bcast(b, ndim):
    """Bias reshaped for explicit broadcasting (the suite raises on rank promotion)."""
    return b.reshape((1,) * (ndim - b.ndim) + b.shape)


def test_outputs_equal_a_manual_fake_quant_computation():
    recipe = recipes.get("nvfp4-rl")
    model, ref = _model(), _model()
    x = _x()
    quantize_model(model, [Rule(r"(up|down)", recipe)])

    @nnx.jit  # the manual computation as one program, not op by op
    def manual(ref, x):  # the MLP with fake_quant, attention and head untouched
        h = ref.norm2(x + ref.attn(ref.norm1(x)))
        hx = x + ref.attn(ref.norm1(x))
        mlp = _fq_linear(jax.nn.gelu(_fq_linear(h, ref.up, recipe)), ref.down, recipe)
        return ref.head(hx + mlp)

    got = nnx.jit(lambda m, x: m(x))(model, x)
    np.testing.assert_allclose(got, manual(ref, x), rtol=1e-6, atol=1e-6)


def test_attention_projections_and_opt_in_score_matmuls():
    recipe = recipes.get("mxfp8")
    model, ref = _model(), _model()
    x = _x()
    quantize_model(model, [Rule(r"attn\.(query|key|value|out)", recipe)])
    y_proj = model.attn(x)
    # manual: q, k, v, out projections with fake_quant, flax's own attention core
    a = ref.attn

    def proj(t, lin):
        k = lin.kernel[...]
        tq = fl.fake_quant(t, recipe.fprop_x.replace(axis=-1))
        kq = fl.fake_quant(k.reshape(k.shape[0], -1), recipe.fprop_w.replace(axis=0))
        return (tq @ kq).reshape(*t.shape[:-1], *k.shape[1:]) + _bcast(lin.bias[...], 4)

    q, k, v = proj(x, a.query), proj(x, a.key), proj(x, a.value)
    core = nnx.dot_product_attention(q, k, v)
    kq = fl.fake_quant(a.out.kernel[...].reshape(D, D), recipe.fprop_w.replace(axis=0))
    cq = fl.fake_quant(core.reshape(*core.shape[:-2], D), recipe.fprop_x.replace(axis=-1))
    want = cq @ kq + _bcast(a.out.bias[...], 3)
    np.testing.assert_allclose(y_proj, want, rtol=2e-5, atol=2e-5)
    # score/value matmuls only when a rule opts into op "attention"
    quantize_model(model, [Rule(r"attn", recipe, ops=("attention",))])
    assert isinstance(model.attn.attention_fn, QuantizedOp)
    assert not np.array_equal(model.attn(x), y_proj)


def test_quantized_attention_with_fp32_recipe_equals_flax_attention():
    model, ref = _model(), _model()
    quantize_model(model, [Rule(r"attn", "fp32", ops=("attention",))])
    x = _x()
    np.testing.assert_allclose(model.attn(x), ref.attn(x), rtol=1e-6, atol=1e-6)


def test_rule_order_first_match_wins_and_none_keeps_high_precision():
    model = _model()
    quantize_model(model, [Rule(r"up", None), Rule(r"(up|down)", "mxfp4"), Rule(r".*", "bf16")])
    table = describe(model).set_index("path")
    assert table.loc["up", "recipe"] == "-"
    assert table.loc["down", "recipe"] == "mxfp4"
    assert table.loc["attn.query", "recipe"] == "bf16"
    assert table.loc["head", "recipe"] == "bf16"
    assert table.loc["attn", "recipe"] == "-"  # attention core is opt-in
    # reversing the order changes the result
    model2 = _model()
    with pytest.warns(UserWarning, match="'up' matched no module"):  # shadowed by ".*"
        quantize_model(model2, [Rule(r".*", "bf16"), Rule(r"up", None)])
    assert describe(model2).set_index("path").loc["up", "recipe"] == "bf16"


def test_unmatched_modules_are_untouched_and_unused_rules_warn():
    model, ref = _model(), _model()
    with pytest.warns(UserWarning, match="matched no module"):
        quantize_model(model, [Rule(r"nothing_here", "nvfp4-rl"), Rule(r"down", "mxfp4")])
    assert model.up.dot_general is ref.up.dot_general
    x = _x()
    np.testing.assert_array_equal(model.up(x), ref.up(x))
    unquantize(model)
    np.testing.assert_array_equal(model(x), ref(x))


def test_unknown_recipe_and_op_are_errors():
    with pytest.raises(ValueError, match="known recipes"):
        Rule(r".*", "nvfp3")
    with pytest.raises(ValueError, match="allowed: dot_general"):
        Rule(r".*", "nvfp4", ops=("matmul",))
    with pytest.raises(ValueError, match="not a valid regex"):
        Rule(r"(", "nvfp4")


def test_stochastic_recipe_needs_a_key():
    with pytest.raises(ValueError, match="needs a key"):
        quantize_model(_model(), [Rule(r".*", "nvfp4")])


def _train_loss(model, x):
    return jnp.mean(model(x) ** 2)


def test_works_under_nnx_jit_and_grad_and_keys_advance():
    model = _model()
    quantize_model(model, [Rule(r".*", "nvfp4")], key=jax.random.key(3))
    x = _x()

    @nnx.jit
    def grads(m, x):
        return nnx.grad(_train_loss)(m, x)

    g1 = grads(model, x)
    g2 = grads(model, x)
    # SR on gradients: a new quantization key per call gives different weight gradients
    assert not np.array_equal(g1["up"]["kernel"][...], g2["up"]["kernel"][...])
    assert int(model.up.dot_general.qcount[...]) == 2
    # the same key stream reproduces
    other = _model()
    quantize_model(other, [Rule(r".*", "nvfp4")], key=jax.random.key(3))
    np.testing.assert_array_equal(grads(other, x)["up"]["kernel"][...], g1["up"]["kernel"][...])


def test_layers_get_distinct_key_streams():
    model = _model()
    quantize_model(model, [Rule(r".*", "nvfp4")], key=jax.random.key(3))
    a = jax.random.key_data(model.up.dot_general.qbase[...])
    b = jax.random.key_data(model.down.dot_general.qbase[...])
    assert not np.array_equal(a, b)


def test_vmap_over_seeds_matches_separate_runs():
    x = _x()

    def loss_for(seed):
        model = _model(0)
        quantize_model(model, [Rule(r".*", "nvfp4")], key=jax.random.key(seed))
        graphdef, state = nnx.split(model)
        return graphdef, state

    graphdef, s0 = loss_for(0)
    _, s1 = loss_for(1)
    states = jax.tree.map(lambda a, b: jnp.stack([a, b]), s0, s1)

    def grad_of(state):
        m = nnx.merge(graphdef, state)
        return nnx.grad(_train_loss)(m, x)["down"]["kernel"][...]

    # compiled, as a training step runs: the vmapped program and the program of one seed
    batched = jax.jit(jax.vmap(grad_of))(states)
    alone = jax.jit(grad_of)
    np.testing.assert_array_equal(batched[0], alone(s0))
    np.testing.assert_array_equal(batched[1], alone(s1))
    assert not np.array_equal(batched[0], batched[1])


def test_describe_lists_every_seam():
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantize_model(model, [Rule(r"head", None), Rule(r".*", "nvfp4-rl")])
    table = describe(model)
    assert list(table.columns) == ["path", "op", "recipe"]
    assert set(table.path) == {
        "attn",
        "attn.query",
        "attn.key",
        "attn.value",
        "attn.out",
        "up",
        "down",
        "head",
    }


class ConvNet(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(32, 32, kernel_size=(3, 3), rngs=rngs)

    def __call__(self, x):
        return self.conv(x)


@pytest.mark.parametrize("backward", ["quantized", "dequantized", "high_precision"])
def test_conv_quantization(backward):
    from jax import lax

    recipe = recipes.get("mxfp4").replace(backward=backward)
    model, ref = ConvNet(nnx.Rngs(0)), ConvNet(nnx.Rngs(0))
    quantize_model(model, [Rule(r"conv", recipe)])
    x = jax.random.normal(jax.random.key(1), (32, 8, 8, 32))  # NHWC
    k = ref.conv.kernel[...]  # HWIO
    xq = fl.fake_quant(x, recipe.fprop_x.replace(axis=3))
    kq = fl.fake_quant(k, recipe.fprop_w.replace(axis=2))  # 32x32 tiles over (O, I)
    dn = ("NHWC", "HWIO", "NHWC")
    want = lax.conv_general_dilated(xq, kq, (1, 1), "SAME", dimension_numbers=dn)
    want = want + _bcast(ref.conv.bias[...], 4)
    np.testing.assert_allclose(model(x), want, rtol=1e-5, atol=1e-5)
    g = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model)["conv"]["kernel"][...]
    g_ref = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(ref)["conv"]["kernel"][...]
    assert g.shape == g_ref.shape and bool(jnp.all(jnp.isfinite(g)))
    rel = float(jnp.linalg.norm(g - g_ref) / jnp.linalg.norm(g_ref))
    assert 0.0 < rel < 0.5


class Lin(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(64, 32, use_bias=False, rngs=rngs)

    def __call__(self, x):
        return self.lin(x)


def test_delayed_scaling_history_and_stale_scales_saturate():
    from fp4lab.nnx import telemetry

    spec = fl.fp8("e4m3").replace(amax_history=3)
    recipe = recipes.GemmRecipe(fprop_x=spec, fprop_w=fl.fp8("e4m3"), backward="high_precision")
    model = Lin(nnx.Rngs(0))
    quantize_model(model, [Rule(r"lin", recipe)], telemetry=True)
    base = jax.random.uniform(jax.random.key(0), (16, 64), minval=-1.0, maxval=1.0)
    base = base.at[0, 0].set(1.0)  # amax exactly 1
    op = model.lin.dot_general
    sat = telemetry.STATS.index("saturated")
    for scale in [1.0, 0.5, 1.0]:  # amax never above the history's max: nothing saturates
        model(base * scale)
        assert float(op.fstats[...][0, 0, sat]) == 0.0
    np.testing.assert_array_equal(op.amax_x[...], [1.0, 0.5, 1.0])  # most recent first
    # the amax jumps: the stale history (max 1.0) saturates everything above 1.0
    y = model(base * 10.0)
    np.testing.assert_array_equal(op.amax_x[...], [10.0, 1.0, 0.5])
    frac = float(op.fstats[...][0, 0, sat])
    want = float(jnp.mean(jnp.abs(base * 10.0) > 1.0))
    assert frac == pytest.approx(want, abs=2 / base.size) and frac > 0.8
    # with current scaling the same input does not saturate
    current = Lin(nnx.Rngs(0))
    quantize_model(current, [Rule(r"lin", recipe.replace(fprop_x=fl.fp8("e4m3")))], telemetry=True)
    y_cur = current(base * 10.0)
    assert float(current.lin.dot_general.fstats[...][0, 0, sat]) == 0.0
    assert float(jnp.max(jnp.abs(y))) < float(jnp.max(jnp.abs(y_cur)))


def test_delayed_scaling_is_validated():
    with pytest.raises(ValueError, match="outer='tensor'"):
        fl.nvfp4(scope="row", amax_history=4)
    with pytest.raises(ValueError, match="amax_algo"):
        fl.fp8("e4m3").replace(amax_history=2, amax_algo="mean")
    bad = recipes.GemmRecipe(dgrad_dy=fl.fp8("e5m2").replace(amax_history=2))
    with pytest.raises(ValueError, match="gradients use current scaling"):
        quantize_model(Lin(nnx.Rngs(0)), [Rule(r"lin", bad)])


def test_unmatched_rules_lists_what_quantize_model_would_warn_about_and_changes_nothing():
    model, ref = _model(), _model()
    rules = [Rule(r".*", "bf16"), Rule(r"up", None), Rule(r"nothing_here", "mxfp4")]
    assert unmatched_rules(model, rules) == rules[1:]  # shadowed by ".*"; matches no path
    assert unmatched_rules(model, [Rule(r"up", None), Rule(r".*", "bf16")]) == []
    assert describe(model).equals(describe(ref))  # nothing quantized
    with pytest.warns(UserWarning) as seen:
        quantize_model(model, rules)
    assert sorted(str(w.message).split("'")[1] for w in seen) == ["nothing_here", "up"]
