"""Backends: the parts of the native path that run on the CPU, and device selection."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4lab as fl
from fp4lab.core import recipes
from fp4lab.ops import native
from fp4lab.ops.dot_general import qdot_general

DN = (((2,), (0,)), ((), ()))
NV = fl.nvfp4(convention="jax")
MX8 = fl.mxfp8(scale_rounding="ceil")
F8 = fl.fp8("e4m3")


def _xw():
    x = jax.random.normal(jax.random.key(0), (2, 16, 64))
    w = jax.random.normal(jax.random.key(1), (64, 32))
    return x, w


@pytest.mark.parametrize("spec,block", [(NV, 16), (MX8, 32)])
def test_native_operands_are_the_simulated_ones_bit_for_bit(spec, block):
    x, _ = _xw()
    x3 = x.reshape(1, 32, 64)
    q = fl.quantize(x3, spec)
    vals, scales, outer = native.to_native(q)
    assert vals.shape == (1, 32, 64) and scales.shape == (1, 32, 64 // block)
    np.testing.assert_array_equal(vals.astype(jnp.float32), q.values())
    np.testing.assert_array_equal(scales.astype(jnp.float32).reshape(q.scale.shape), q.scale)
    np.testing.assert_array_equal(outer, jnp.asarray(q.outer).reshape(-1)[0])
    # the scale layout is the one jax.nn.scaled_matmul documents: a * repeat(scales, block)
    deq = vals.astype(jnp.float32) * jnp.repeat(scales.astype(jnp.float32), block, axis=-1)
    np.testing.assert_array_equal(deq * outer, q.dequantize())


@pytest.mark.parametrize("spec", [NV, MX8, F8])
def test_native_forward_matches_simulated_within_accumulation_error(spec):
    x, w = _xw()
    recipe = recipes.GemmRecipe(fprop_x=spec, fprop_w=spec)
    y_sim = qdot_general(x, w, DN, recipe)
    y_nat = native.native_fprop(x, w, DN, spec, spec, matmul=native.reference_matmul)
    assert y_nat.shape == y_sim.shape == (2, 16, 32)
    np.testing.assert_allclose(y_nat, y_sim, rtol=1e-5, atol=1e-4 * float(jnp.abs(y_sim).max()))


def test_output_rescaling_is_the_product_of_outer_scales():
    x, w = _xw()
    seen = {}

    def spy(a, b, sa, sb, preferred_element_type):
        out = native.reference_matmul(a, b, sa, sb, preferred_element_type)
        seen["raw"] = out
        return out

    y = native.native_fprop(x, w, DN, NV, NV, matmul=spy)
    gx = float(jnp.abs(x).max()) / (6 * 448)
    gw = float(jnp.abs(w).max()) / (6 * 448)
    np.testing.assert_array_equal(
        y.reshape(1, 32, 32), seen["raw"] * (jnp.float32(gx) * jnp.float32(gw))
    )


def test_native_kind():
    assert native.native_kind(NV, NV) == "nvfp4"
    assert native.native_kind(MX8, MX8) == "mxfp8"
    assert native.native_kind(F8, fl.fp8("e5m2")) == "fp8"
    assert native.native_kind(fl.nvfp4(), fl.nvfp4()) is None  # "te" convention: simulated only
    assert native.native_kind(fl.mxfp8(), fl.mxfp8()) is None  # floor rule: not what RCEIL does
    assert native.native_kind(NV.replace(rounding="stochastic"), NV) is None
    assert native.native_kind(NV, None) is None


def test_device_selection_with_fake_devices():
    blackwell = native.Device("gpu", 10.0, "B200")
    hopper = native.Device("gpu", 9.0, "H100")
    cpu = native.Device("cpu", None, "cpu")
    assert native.resolve(NV, NV, "native", blackwell) == "native"
    assert native.resolve(F8, F8, "native", hopper) == "native"
    with pytest.raises(RuntimeError, match="compute capability >= 10"):
        native.resolve(NV, NV, "native", hopper)
    with pytest.raises(RuntimeError, match="cpu"):
        native.resolve(NV, NV, "native", cpu)
    with pytest.raises(ValueError, match="no native kernel"):
        native.resolve(fl.nvfp4(), fl.nvfp4(), "native", blackwell)
    with pytest.raises(ValueError, match="allowed: 'simulated', 'native', 'auto'"):
        native.resolve(NV, NV, "gpu", blackwell)
    assert native.resolve(NV, NV, "simulated", blackwell) == "simulated"


def test_auto_falls_back_and_says_so_once():
    native.reset_announcements()
    tiny = native.Device("cpu", None, "cpu")
    with pytest.warns(UserWarning, match="chose simulated"):
        assert native.resolve(NV, NV, "auto", tiny) == "simulated"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.resolve(NV, NV, "auto", tiny) == "simulated"
    with pytest.warns(UserWarning, match="chose native"):
        assert native.resolve(NV, NV, "auto", native.Device("gpu", 10.0, "B200")) == "native"


def test_native_on_this_cpu_is_a_clear_error():
    x, w = _xw()
    recipe = recipes.GemmRecipe(fprop_x=NV, fprop_w=NV)
    if native.current_device().platform != "cpu":
        pytest.skip("runs on CPU machines")
    with pytest.raises(RuntimeError, match="needs a GPU"):
        qdot_general(x, w, DN, recipe, backend="native")
