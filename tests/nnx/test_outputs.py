"""GemmRecipe.outputs: every GEMM's output rounded, straight through, against jax's own casts."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

import fp4lab as fl
from fp4lab import schema
from fp4lab.core.recipes import GemmRecipe
from fp4lab.ops.dot_general import qdot_general
from fp4lab.train.config import Config, ConfigError
from fp4lab.train.trainer import make_keys, make_train

BF16 = fl.core.spec.cast_spec("bf16")
DN = (((1,), (0,)), ((), ()))


class TwoLayers(nnx.Module):
    """Linear -> GELU -> Linear: the GEMM outputs are the GELU's input and the model's output."""

    def __init__(self, rngs):
        self.up = nnx.Linear(16, 64, rngs=rngs)
        self.down = nnx.Linear(64, 32, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x)))


def _reference(model, x):
    """The same model written out, each GEMM's output cast to bfloat16 by jax and passed
    straight through (v + stop_gradient(round(v) - v) is round(v) exactly: Sterbenz)."""

    def rounded(v):
        return v + jax.lax.stop_gradient(v.astype(jnp.bfloat16).astype(jnp.float32) - v)

    h = rounded(x @ model.up.kernel[...]) + model.up.bias[None]  # the bias is added after
    return rounded(jax.nn.gelu(h) @ model.down.kernel[...]) + model.down.bias[None]


def _loss(fn):
    return lambda m: jnp.sum(fn(m) ** 2)


def test_outputs_round_each_gemm_s_output_and_pass_the_gradient_straight_through():
    x = jax.random.normal(jax.random.key(1), (8, 16))
    model = TwoLayers(nnx.Rngs(0))
    plain = TwoLayers(nnx.Rngs(0))
    recipe = fl.recipes.get("fp32").replace(outputs=BF16)
    fl.quantize_model(model, [fl.Rule(".*", recipe)])
    y = model(x)
    np.testing.assert_array_equal(y, _reference(plain, x))
    # the last GEMM's output sits on the bfloat16 grid before its bias (ml_dtypes' cast)
    y_dot = np.asarray(y - model.down.bias[None])
    assert np.abs(y_dot - y_dot.astype(ml_dtypes.bfloat16).astype(np.float32)).max() < 1e-6
    assert np.abs(np.asarray(y) - np.asarray(plain(x))).max() > 0  # and it did round
    g = nnx.grad(_loss(lambda m: m(x)))(model)
    g_ref = nnx.grad(_loss(lambda m: _reference(m, x)))(plain)
    for layer in ("up", "down"):
        for p in ("kernel", "bias"):
            np.testing.assert_allclose(g[layer][p][...], g_ref[layer][p][...], rtol=1e-6)
    table = fl.describe(model)
    assert set(table["recipe"]) == {"fp32+outputs=bf16"}


def test_outputs_in_mxfp4_are_fake_quant_of_the_gemm_under_jit_and_with_telemetry():
    x = jax.random.normal(jax.random.key(2), (8, 64))
    w = jax.random.normal(jax.random.key(3), (64, 96)) / 8
    recipe = fl.recipes.get("mxfp4").replace(outputs=fl.mxfp4())
    y = jax.jit(lambda a, b: qdot_general(a, b, DN, recipe))(x, w)
    y_plain = qdot_general(x, w, DN, "mxfp4")
    np.testing.assert_array_equal(y, fl.fake_quant(y_plain, fl.mxfp4()))
    probe = jnp.zeros((len(schema.BWD_OPERANDS), len(schema.STATS)), jnp.float32)
    y_t, stats = qdot_general(x, w, DN, recipe, probe=probe)
    np.testing.assert_array_equal(y_t, y)
    assert stats.shape == (len(schema.FWD_OPERANDS), len(schema.STATS))


def test_an_output_the_block_does_not_divide_is_refused_with_its_layer_or_padded():
    x = jax.random.normal(jax.random.key(1), (4, 16))
    recipe = fl.recipes.get("bf16").replace(outputs=fl.mxfp4())  # down's output is 32 wide
    model = TwoLayers(nnx.Rngs(0))
    model.down = nnx.Linear(64, 48, rngs=nnx.Rngs(1))
    fl.quantize_model(model, [fl.Rule(".*", recipe)])
    with pytest.raises(
        ValueError, match=r"layer 'down'.*axis -1 is not a multiple of the outputs spec's block 32"
    ):
        model(x)
    padded = TwoLayers(nnx.Rngs(0))
    padded.down = nnx.Linear(64, 48, rngs=nnx.Rngs(1))
    fl.quantize_model(padded, [fl.Rule(".*", recipe.replace(pad=True))])
    assert padded(x).shape == (4, 48)


def test_the_outputs_field_is_checked_named_and_kept_out_of_earlier_ids():
    with pytest.raises(ValueError, match="GemmRecipe.outputs=.*deterministic"):
        GemmRecipe(outputs=fl.nvfp4(rounding="stochastic"))
    with pytest.raises(ValueError, match="GemmRecipe.outputs must be a QuantSpec"):
        GemmRecipe(outputs="mxfp4")
    with pytest.raises(ValueError, match="override 'outputs'"):
        fl.recipes.override(fl.recipes.get("bf16"), {"outputs": "mxfp4"})
    with pytest.raises(ValueError, match="did you mean 'outputs'"):
        fl.recipes.override(fl.recipes.get("bf16"), {"output": fl.mxfp4()})
    recipe = fl.recipes.override(fl.recipes.get("bf16"), {"outputs": fl.mxfp4()})
    assert recipe.outputs == fl.mxfp4()
    assert GemmRecipe.from_dict(recipe.to_dict()) == recipe
    assert "outputs" not in fl.recipes.get("bf16").to_dict()  # the ids of earlier runs stay


def test_config_gemms_outputs_trains_and_is_its_own_run():
    base = Config(
        task="proxy",
        din=16,
        dout=32,
        teacher_hidden=(32,),
        d_model=32,
        d_ff=64,
        n_layers=1,
        batch_size=16,
        steps=3,
        eval_batches=1,
        recipe="bf16",
    )
    cfg = base.replace(gemms={"outputs": fl.mxfp4()})
    with pytest.raises(ConfigError, match="outputs"):
        base.replace(gemms={"outputz": fl.mxfp4()})
    with pytest.raises(ConfigError, match="outputs takes a QuantSpec .* not a recipe name"):
        base.replace(gemms={"outputs": "nvfp5"})
    assert Config.from_dict(cfg.to_dict()) == cfg
    a, b = (jax.jit(make_train(c))(make_keys(0, 0, 0)) for c in (base, cfg))
    assert np.isfinite(b["loss"]).all() and not np.array_equal(a["loss"], b["loss"])


def test_a_registered_recipe_changed_by_replace_is_labelled_by_the_change(tmp_path):
    from fp4lab import sweep

    path = tmp_path / "exp.py"
    path.write_text(
        "import fp4lab as fl\n"
        "def get_config():\n"
        "    return fl.Config(task='proxy', din=32, dout=32, teacher_hidden=(32,), d_model=32,\n"
        "                     d_ff=64, n_layers=1, batch_size=16, steps=3, eval_batches=1)\n"
        "def sweep(add):\n"
        "    add(recipe='nvfp4')\n"
        "    add(recipe=fl.recipes.get('nvfp4').replace(outputs=fl.mxfp4()))\n"
        "    add(recipe=fl.recipes.get('nvfp4').replace(fprop_x=None))\n"
    )
    labels = [c.label for c in sweep.load_experiment(path).cells]
    assert labels == [
        "recipe=nvfp4",
        "recipe=nvfp4+outputs=e2m1/1x32/e8m0",
        "recipe=nvfp4+modified",
    ]
