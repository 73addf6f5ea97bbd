"""Eager calls of the public quantizer compile once per spec, shape and dtype.

`fl.quantize`, `QTensor.dequantize` and `fl.fake_quant` are jitted inside: a first call of a
new shape compiles a few programs (not one per primitive, as op-by-op dispatch did: about 200
for NVFP4), and later calls of that shape compile none.
"""

import logging

import jax
import numpy as np
import pytest

import fp4lab as fl


class _Compiles(logging.Handler):
    """Counts XLA compilations jax logs under `jax.log_compiles()`."""

    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.names: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Finished XLA compilation of"):
            self.names.append(message.split()[4])


@pytest.fixture
def compiles():
    handler, logger = _Compiles(), logging.getLogger("jax")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        with jax.log_compiles():
            yield handler.names
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


SPECS = {
    "nvfp4": fl.nvfp4(),
    "mxfp4-sr": fl.mxfp4(rounding="stochastic"),
    "fp8": fl.fp8(),
}


@pytest.mark.parametrize("name", SPECS)
def test_quantize_and_dequantize_compile_once_per_shape(name, compiles):
    spec = SPECS[name]
    key = jax.random.key(0) if spec.needs_key else None
    x = np.random.default_rng(1).normal(size=(48, 160)).astype(np.float32)  # a shape of its own
    first = fl.quantize(x, spec, key=key).dequantize()
    n_first = len(compiles)
    assert 1 <= n_first <= 4, compiles  # quantize, dequantize, a transfer or two
    again = fl.quantize(2 * x, spec, key=key).dequantize()
    fake = fl.fake_quant(x, spec, key=key)
    n_fake = len(compiles) - n_first
    fl.fake_quant(3 * x, spec, key=key)
    assert len(compiles) == n_first + n_fake, compiles[n_first + n_fake :]  # nothing new
    assert n_fake <= 4, compiles[n_first:]
    # and the jitted paths agree with each other, bit for bit
    np.testing.assert_array_equal(np.asarray(first), np.asarray(fake))
    assert np.asarray(again).shape == x.shape
