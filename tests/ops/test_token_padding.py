"""Wgrad contracts over tokens: a token count the blocks or the Hadamard size do not divide is
zero-padded, exactly (the same bits as padding the inputs by hand), and other shape errors name
the GEMM, the operand and the axis."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lab.ops.conv import qconv_general_dilated
from fp4lab.ops.dot_general import DotGemm, qdot_general
from fp4lab.ops.plan import resolve_recipe

DN = (((1,), (0,)), ((), ()))
KEY = jax.random.key(0)
RECIPES = ["nvfp4", "mxfp4-h16", "nvfp4-no-h"]  # Hadamard 16 + SR; MX + Hadamard; no rotation


def normal(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def grads(recipe, x, w, dy, dn=DN):
    y, vjp = jax.vjp(lambda a, b: qdot_general(a, b, dn, recipe=recipe, key=KEY), x, w)
    return (y, *vjp(dy))


@pytest.mark.parametrize("recipe", RECIPES)
def test_124_tokens_equal_the_hand_padded_reference(recipe):
    x, w, dy = normal(1, (124, 128)), normal(2, (128, 64)), normal(3, (124, 64))
    y, dx, dw = grads(recipe, x, w, dy)
    pad = ((0, 4), (0, 0))
    y_ref, dx_ref, dw_ref = grads(recipe, jnp.pad(x, pad), w, jnp.pad(dy, pad))  # 128 tokens
    np.testing.assert_array_equal(dw, dw_ref)
    np.testing.assert_array_equal(dx, dx_ref[:124])
    np.testing.assert_array_equal(y, y_ref[:124])
    assert np.isfinite(np.asarray(dw)).all() and float(jnp.abs(dw).max()) > 0


def test_token_axes_of_several_dimensions_are_padded_as_one():
    """4 sequences of 31 tokens: the Wgrad contracts the 124 merged tokens."""
    x, w, dy = normal(1, (4, 31, 128)), normal(2, (128, 64)), normal(3, (4, 31, 64))
    dn = (((2,), (0,)), ((), ()))
    _, _, dw = grads("nvfp4", x, w, dy, dn)
    pad = ((0, 4), (0, 0))
    flat = grads("nvfp4", jnp.pad(x.reshape(124, 128), pad), w, jnp.pad(dy.reshape(124, 64), pad))
    np.testing.assert_array_equal(dw, flat[2])


@pytest.mark.parametrize("tokens, padded", [(128, 128), (112, 112), (124, 128), (7, 16)])
def test_only_a_count_that_does_not_divide_is_padded(tokens, padded):
    recipe, _ = resolve_recipe("nvfp4", KEY)
    gemm = DotGemm(recipe=recipe, dimension_numbers=DN)
    lay = gemm.layout((tokens, 128), (128, 64))
    assert gemm.token_padding(lay, tokens) == padded
    plain = DotGemm(recipe=recipe.replace(backward="high_precision"), dimension_numbers=DN)
    assert plain.token_padding(lay, tokens) == tokens  # nothing quantized along the tokens


def test_conv_batch_is_padded_exactly():
    x, k = normal(1, (20, 6, 6, 16)), normal(2, (3, 3, 16, 32))
    dn = ("NHWC", "HWIO", "NHWC")

    def f(a, b):
        return qconv_general_dilated(
            a, b, (1, 1), "SAME", dimension_numbers=dn, recipe="nvfp4-no-h", key=KEY
        )

    dy = normal(3, (20, 6, 6, 32))
    _, vjp = jax.vjp(f, x, k)
    _, dk = vjp(dy)
    pad = ((0, 12), (0, 0), (0, 0), (0, 0))
    _, vjp_ref = jax.vjp(f, jnp.pad(x, pad), k)
    _, dk_ref = vjp_ref(jnp.pad(dy, pad))
    np.testing.assert_array_equal(dk, dk_ref)


def test_a_feature_axis_that_does_not_divide_names_gemm_operand_and_axis():
    x, w = normal(1, (32, 100)), normal(2, (100, 64))
    with pytest.raises(ValueError) as e:
        qdot_general(x, w, DN, recipe="nvfp4", key=KEY)
    message = str(e.value)
    assert "Fprop GEMM, operand x (fprop_x), blocked along axis 2 of its layout shape" in message
    assert "(1, 32, 100)" in message


def test_mismatched_contraction_sizes_are_named():
    with pytest.raises(ValueError, match=r"contracting dimensions differ: lhs axes \(1,\)"):
        qdot_general(normal(1, (32, 64)), normal(2, (48, 16)), DN, recipe="nvfp4", key=KEY)


def test_a_causal_lm_step_on_124_tokens_trains():
    """4 sequences of 32 tokens, 31 predicted each: the step that used to stop in Wgrad."""
    from fp4lab.sweep.compute import compute_cell
    from fp4lab.train.config import Config

    cfg = Config(task="markov", seq_len=31, batch_size=4, steps=2, recipe="nvfp4", d_model=32)
    # one block: every GEMM of it contracts the 124 tokens in Wgrad, as a deeper model's do
    cfg = cfg.replace(n_layers=1, n_heads=2, d_ff=64, eval_batches=1, seed_batch=1, warmup=0)
    (run,) = compute_cell(cfg.to_dict(), [(0, 0, 0)])
    assert np.isfinite(run["series"]["loss"]).all()
