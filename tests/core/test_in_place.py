"""Quantizing along an axis that is not last, where the axis lies.

`quantize_dequantize` (the fake-quant path every GEMM operand takes) blocks an inner axis in
place instead of moving it last and back, which on the CPU cost two transposes per operand.
The reference is `quantize(...).dequantize()`, which always moves the axis (its codes are laid
out that way): the two must agree bit for bit, random bits and Hadamard signs included.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4lab as fl
from fp4lab.core import hadamard
from fp4lab.core.quantize import quantize, quantize_dequantize

H = hadamard.Hadamard
SPECS = {
    "nvfp4": fl.nvfp4(),
    "nvfp4-2d": fl.nvfp4(tile=(16, 16)),
    "nvfp4-sr": fl.nvfp4(rounding="stochastic"),
    "nvfp4-h16-random-sr": fl.nvfp4(transform=H(16, "random"), rounding="stochastic"),
    "nvfp4-h16": fl.nvfp4(transform=H(16)),
    "nvfp4-jax": fl.nvfp4(convention="jax"),
    "nvfp4-no-outer": fl.nvfp4(scope="none"),
    "mxfp4-sr": fl.mxfp4(rounding="stochastic"),
    "mxfp4-h32-random": fl.mxfp4(transform=H(32, "random")),
    "fp8": fl.fp8(),
    "fp32-blocks-sr": fl.QuantSpec(
        elem="e2m1", tile=(1, 16), block_scale="fp32", outer="none", rounding="stochastic"
    ),
    "bf16": fl.cast_spec("bf16"),
    # not taken in place (row scopes, four-over-six's ordered sums): the moved path, unchanged
    "nvfp4-row": fl.nvfp4(scope="row"),
    "nvfp4-4o6": fl.nvfp4(four_over_six="mae"),
}


def _x(shape):
    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, shape) * jnp.exp(2 * jax.random.normal(k2, shape))
    return x.at[(0,) * len(shape)].set(0.0)


LAYOUTS = [((64, 48), 0), ((2, 64, 48), 1), ((64, 2, 48), -3)]


@functools.cache
def _grid(name):
    """{(shape, axis, rotated): (moved layout, in place)} of one spec: every case of the grid
    through each path as one program (one compile per path and spec, not per case)."""
    cases = [(shape, axis, rotated) for shape, axis in LAYOUTS for rotated in (True, False)]
    key, tkey = jax.random.key(1), jax.random.key(2)

    def each(path):
        def run(xs):
            return [path(xs[s], SPECS[name].replace(axis=a), r) for s, a, r in cases]

        return jax.jit(run)({shape: _x(shape) for shape, _ in LAYOUTS})

    moved = each(
        lambda x, spec, r: quantize(x, spec, key=key, transform_key=tkey).dequantize(rotated=r)
    )
    here = each(
        lambda x, spec, r: quantize_dequantize(x, spec, key=key, transform_key=tkey, rotated=r)
    )
    return dict(zip(cases, zip(moved, here, strict=True), strict=True))


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("shape, axis", LAYOUTS)
@pytest.mark.parametrize("rotated", [True, False])
def test_in_place_equals_the_moved_layout_bit_for_bit(name, shape, axis, rotated):
    ref, got = _grid(name)[shape, axis, rotated]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))


def test_the_in_place_path_has_no_transposes():
    x = _x((64, 48))
    spec = fl.nvfp4(transform=H(16, "random"), rounding="stochastic").replace(axis=0)
    jaxpr = str(jax.make_jaxpr(lambda x: quantize_dequantize(x, spec, key=jax.random.key(1)))(x))
    assert "transpose" not in jaxpr
    moved = str(jax.make_jaxpr(lambda x: quantize(x, spec, key=jax.random.key(1)).dequantize())(x))
    assert "transpose" in moved  # the reference does move the axis


def test_other_key_implementations_draw_the_same_bits_in_place():
    """Keys jax draws with its own generator (here "rbg") take the positions' bits from the
    stream in the moved layout's order too."""
    spec = fl.nvfp4(rounding="stochastic").replace(axis=0)
    x, key = _x((64, 48)), jax.random.key(3, impl="rbg")
    ref = quantize(x, spec, key=key).dequantize()
    np.testing.assert_array_equal(np.asarray(quantize_dequantize(x, spec, key=key)), ref)


def test_nan_poisons_the_same_scope_in_place():
    x = _x((64, 48)).at[10, 3].set(jnp.nan)
    for scope, nans in (("tensor", 64 * 48), ("none", 16)):
        spec = fl.nvfp4(scope=scope).replace(axis=0)
        got = np.asarray(quantize_dequantize(x, spec))
        np.testing.assert_array_equal(got, quantize(x, spec).dequantize())
        assert np.isnan(got).sum() == nans


def test_shapes_that_need_padding_take_the_moved_path_and_its_errors():
    x = _x((40, 48))  # 40 rows: not a multiple of 16 along axis 0
    spec = fl.nvfp4().replace(axis=0)
    with pytest.raises(ValueError, match="does not divide"):
        quantize_dequantize(x, spec)
    padded = spec.replace(pad=True)
    np.testing.assert_array_equal(
        np.asarray(quantize_dequantize(x, padded)), quantize(x, padded).dequantize()
    )
