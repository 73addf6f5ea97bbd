"""Quantized norm vectors: flax's own LayerNorm / RMSNorm read through fake_quant, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import fp4lab as fl
from fp4lab.core.recipes import GemmRecipe
from fp4lab.models import ResidualMLP, Transformer, TransformerConfig
from fp4lab.nnx import norms
from fp4lab.train.config import Config, ConfigError

SPEC = fl.mxfp4()


def _vectors(width, key=0):
    k1, k2 = jax.random.split(jax.random.key(key))
    return 1.0 + 0.3 * jax.random.normal(k1, (width,)), 0.2 * jax.random.normal(k2, (width,))


@pytest.mark.parametrize("cls", [nnx.LayerNorm, nnx.RMSNorm])
def test_a_quantized_norm_is_flax_s_norm_with_quantized_vectors(cls):
    scale, bias = _vectors(64)
    x = jax.random.normal(jax.random.key(3), (8, 64))
    q = cls(64, rngs=nnx.Rngs(0))
    ref = cls(64, rngs=nnx.Rngs(0))
    q.scale[...] = scale
    ref.scale[...] = fl.fake_quant(scale, SPEC)  # the independent reference: flax's own call
    if cls is nnx.LayerNorm:
        q.bias[...] = bias
        ref.bias[...] = fl.fake_quant(bias, SPEC)
    norms.set_norm_spec(q, SPEC, "n")
    assert norms.norm_spec(q) == SPEC and isinstance(q, cls)
    np.testing.assert_array_equal(q(x), ref(x))
    np.testing.assert_array_equal(q.scale[...], scale)  # the parameter itself stays float32
    # straight-through: the gradient of the quantized norm is the plain one at the quantized
    # vectors (d fake_quant / dv = 1)
    g = nnx.grad(lambda m: jnp.sum(m(x) ** 3))(q)
    g_ref = nnx.grad(lambda m: jnp.sum(m(x) ** 3))(ref)
    np.testing.assert_array_equal(g["scale"][...], g_ref["scale"][...])
    # under jit, split and merged as the trainer does, against the reference under jit
    graph, params, rest = nnx.split(q, nnx.Param, ...)
    y = jax.jit(lambda p: nnx.merge(graph, p, rest)(x))(params)
    np.testing.assert_array_equal(y, jax.jit(lambda m: m(x))(ref))
    norms.set_norm_spec(q, None, "n")
    assert type(q) is cls and norms.norm_spec(q) is None


def test_quantize_model_reaches_the_norms_its_rules_give_a_norms_spec():
    model = ResidualMLP(32, 64, 128, 2, 16, rngs=nnx.Rngs(0))
    recipe = fl.recipes.get("bf16").replace(norms=SPEC)
    fl.quantize_model(model, [fl.Rule(r"blocks\.1\..*", "bf16"), fl.Rule(".*", recipe)])
    table = fl.describe(model)
    normed = table[table["op"] == "norm"]
    assert list(normed["path"]) == ["blocks.0.norm", "norm"]  # block 1 takes the bf16 rule
    assert set(normed["recipe"]) == {f"norms={SPEC.summary()}"}
    assert norms.norm_spec(model.blocks[1].norm) is None
    fl.nnx.rules.unquantize(model)
    assert not (fl.describe(model)["op"] == "norm").any()
    # a rule that reaches only a norm's vectors is a rule that matched
    only = [fl.Rule(r"norm", recipe), fl.Rule(".*", None)]
    assert fl.nnx.rules.unmatched_rules(model, only) == []
    fl.nnx.rules.check_rules(nnx.eval_shape(lambda: model), only)


@pytest.mark.parametrize("scan", [False, True])
def test_the_transformer_s_rmsnorms_scanned_or_not(scan):
    cfg = TransformerConfig(vocab=32, d_model=64, n_layers=2, d_ff=64, scan_layers=scan)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    plain = Transformer(cfg, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 8), 0, 32)
    fl.quantize_model(model, [fl.Rule(".*", fl.recipes.get("fp32").replace(norms=SPEC))])
    normed = fl.describe(model).query("op == 'norm'")["path"].tolist()
    assert normed == (
        ["blocks.attn_norm", "blocks.mlp_norm", "norm"]
        if scan
        else [
            "blocks.0.attn_norm",
            "blocks.0.mlp_norm",
            "blocks.1.attn_norm",
            "blocks.1.mlp_norm",
            "norm",
        ]
    )
    # the reference: the plain model with every norm scale replaced by its quantized value
    quantized = dict(nnx.iter_modules(model))
    for path, p in nnx.iter_modules(plain):
        if isinstance(p, nnx.RMSNorm):
            p.scale[...] = fl.fake_quant(p.scale[...] * 1.37 - 0.2, SPEC)
            quantized[path].scale[...] = quantized[path].scale[...] * 1.37 - 0.2
    np.testing.assert_array_equal(model(tokens), plain(tokens))


def test_bad_norm_specs_are_refused_by_name():
    with pytest.raises(ValueError, match="deterministic"):
        GemmRecipe(norms=fl.mxfp4(rounding="stochastic"))
    model = nnx.LayerNorm(48, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="ln.scale: width 48 is not a multiple"):
        norms.set_norm_spec(model, SPEC, "ln")
    with pytest.raises(ConfigError, match="norms"):
        Config(task="proxy", gemms={"norms": "mxfp4"})  # a recipe name is not a spec


def test_the_norms_spec_is_in_the_config_and_its_json_not_in_other_recipes():
    cfg = Config(task="proxy", recipe="bf16", gemms={"norms": SPEC})
    again = Config.from_dict(cfg.to_dict())
    assert again == cfg
    assert "norms" not in fl.recipes.get("mxfp4").to_dict()  # earlier ids unchanged
    assert GemmRecipe.from_dict(fl.recipes.get("bf16").replace(norms=SPEC).to_dict()).norms == SPEC
    plain = Config(task="proxy", recipe="bf16")
    assert plain.to_dict() != cfg.to_dict()
