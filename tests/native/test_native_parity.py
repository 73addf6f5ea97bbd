"""Native path end to end where jax.nn.scaled_matmul lowers (jax >= 0.11 on CPU, or a GPU).

The test command runs this file in a Python 3.12 environment with jax >= 0.11 when one can be
made; elsewhere the tests skip and say why.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4lab as fl
from fp4lab import schema
from fp4lab.core import recipes
from fp4lab.ops import custom_vjp as scaffold
from fp4lab.ops import native
from fp4lab.ops.dot_general import DotGemm, qdot_general


def _lowers() -> bool:
    a = jnp.ones((1, 8, 32), jnp.float4_e2m1fn)
    s = jnp.ones((1, 8, 2), jnp.float8_e4m3fn)
    try:
        jax.nn.scaled_matmul(a, a, s, s).block_until_ready()
    except NotImplementedError:
        return False
    return True


pytestmark = pytest.mark.skipif(
    not _lowers(), reason=f"jax {jax.__version__} cannot lower jax.nn.scaled_matmul here"
)

DN = (((2,), (0,)), ((), ()))


@pytest.mark.parametrize("spec", [fl.nvfp4(convention="jax"), fl.mxfp8(scale_rounding="ceil")])
def test_native_matmul_matches_the_simulator(spec):
    x = jax.random.normal(jax.random.key(0), (2, 32, 128))
    w = jax.random.normal(jax.random.key(1), (128, 64))
    y_nat = native.native_fprop(x, w, DN, spec, spec)
    y_sim = qdot_general(x, w, DN, recipes.GemmRecipe(fprop_x=spec, fprop_w=spec))
    scale = float(jnp.abs(y_sim).max())
    np.testing.assert_allclose(y_nat, y_sim, rtol=1e-5, atol=1e-5 * scale)


def test_jax_scaled_dot_general_matches_the_simulator_with_the_same_global_scales():
    x = jax.random.normal(jax.random.key(2), (32, 128))
    w = jax.random.normal(jax.random.key(3), (64, 128))  # (N, K): contraction on the last axis
    gx = jnp.max(jnp.abs(x)) / jnp.float32(6 * 448)
    gw = jnp.max(jnp.abs(w)) / jnp.float32(6 * 448)
    cfg = [jax.nn.get_scaled_dot_general_config("nvfp4", global_scale=g) for g in (gx, gw)]
    dn = (((1,), (1,)), ((), ()))
    y_jax = jax.nn.scaled_dot_general(x, w, dn, configs=cfg)
    spec = fl.nvfp4(convention="jax")
    y_sim = qdot_general(x, w, dn, recipes.GemmRecipe(fprop_x=spec, fprop_w=spec))
    scale = float(jnp.abs(y_sim).max())
    np.testing.assert_allclose(y_jax, y_sim, rtol=1e-5, atol=1e-5 * scale)


def _cotangent(shape):
    return jax.random.normal(jax.random.key(9), shape)


def _all_six(spec) -> recipes.GemmRecipe:
    return recipes.GemmRecipe(**dict.fromkeys(schema.OPERAND_NAMES, spec))


@pytest.mark.parametrize("spec", [fl.nvfp4(convention="jax"), fl.mxfp8(scale_rounding="ceil")])
@pytest.mark.parametrize(
    "dn,shapes",
    [
        ((((2,), (0,)), ((), ())), ((2, 32, 128), (128, 64))),  # a dense layer on (B, T, D)
        ((((1,), (1,)), ((), ())), ((64, 96), (32, 96))),  # contraction on both last axes
    ],
)
def test_all_three_gemms_natively_match_the_simulator_values_and_gradients(spec, dn, shapes):
    x = jax.random.normal(jax.random.key(4), shapes[0])
    w = jax.random.normal(jax.random.key(5), shapes[1])
    recipe = _all_six(spec)

    def run(backends):
        gemm = DotGemm(recipe=recipe, dimension_numbers=dn, backends=backends)

        def loss(x, w):
            y = scaffold.apply(gemm, x, w, (jax.random.key(0), {}, None))
            return jnp.sum(y * _cotangent(y.shape)), y  # the cotangent is fixed, not from y

        return jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(x, w)

    sim = run(("simulated",) * 3)
    for backends in [("native",) * 3, ("simulated", "native", "simulated")]:
        nat = run(backends)
        for a, b in zip(jax.tree.leaves(sim), jax.tree.leaves(nat), strict=True):
            scale = float(jnp.abs(a).max())
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * scale)
