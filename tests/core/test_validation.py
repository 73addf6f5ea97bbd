"""QuantSpec and quantize reject bad input with one clear error naming the field and value."""

import jax.numpy as jnp
import numpy as np
import pytest

from fp4lab.core.quantize import fake_quant, quantize, quantize_dequantize
from fp4lab.core.spec import QuantSpec, nvfp4


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(tile="16"), "QuantSpec.tile='16'; allowed: an int n >= 1"),
        (dict(tile=(1.0, 16.0)), "QuantSpec.tile=(1.0, 16.0)"),
        (dict(tile=(1, 16, 1)), "QuantSpec.tile=(1, 16, 1)"),
        (dict(tile=0), "QuantSpec.tile=(1, 0)"),
        (dict(axis="-1"), "QuantSpec.axis='-1' (str); allowed: an int"),
        (dict(amax_history=2.0), "QuantSpec.amax_history=2.0 (float); allowed: an int"),
        (dict(pad="yes"), "QuantSpec.pad='yes'; allowed: True or False"),
        (dict(rounding="rn"), "did you mean 'rne'?"),
    ],
)
def test_quant_spec_rejects(change, message):
    with pytest.raises(ValueError) as e:
        QuantSpec(**change)
    assert message in str(e.value)


def test_quant_spec_tile_forms():
    assert QuantSpec(tile=16).tile == (1, 16) and QuantSpec(tile=[16, 16]).tile == (16, 16)


@pytest.mark.parametrize("amax", [-1.0, 0.0, float("nan"), float("inf"), [1.0, -2.0]])
@pytest.mark.parametrize("fn", [quantize, quantize_dequantize, fake_quant])
def test_a_bad_amax_is_an_error(fn, amax):
    x = jnp.ones((2, 16), jnp.float32)
    with pytest.raises(ValueError, match=r"amax=.*; allowed: finite values > 0"):
        fn(x, nvfp4(), amax=jnp.asarray(amax))


def test_a_good_amax_is_used():
    x = jnp.ones((2, 16), jnp.float32)
    assert np.isfinite(np.asarray(quantize_dequantize(x, nvfp4(), amax=2.0))).all()


@pytest.mark.parametrize("shape", [(0, 16), (4, 0), (0,)])
def test_an_empty_input_is_an_error(shape):
    with pytest.raises(ValueError, match=r"quantize got an empty array of shape"):
        quantize_dequantize(jnp.zeros(shape, jnp.float32), nvfp4())


@pytest.mark.parametrize("fn", [quantize, quantize_dequantize, fake_quant])
def test_a_spec_that_is_not_a_quant_spec_is_an_error(fn):
    """Caught before quantize_dequantize's jit would hash the spec as a static argument."""
    with pytest.raises(ValueError, match=r"quantize needs a QuantSpec, got str"):
        fn(jnp.ones((2, 16), jnp.float32), "nvfp4")


@pytest.mark.parametrize("fn", [quantize, quantize_dequantize, fake_quant])
def test_an_integer_input_is_an_error(fn):
    with pytest.raises(ValueError, match=r"quantize needs a floating-point array, got int32"):
        fn(jnp.ones((2, 16), jnp.int32), nvfp4())
