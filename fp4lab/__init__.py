"""fp4lab: numerical-stability research on 4-bit (FP4) training, in JAX.

The public API, re-exported; nothing is defined here.
"""

from fp4lab import formats, scaling, transforms
from fp4lab.formats import format_names, get_format
from fp4lab.quantize import (
    QTensor,
    QuantSpec,
    cast_spec,
    fake_quant,
    fp8,
    mxfp4,
    mxfp8,
    nvfp4,
    quantize,
    quantize_dequantize,
)
from fp4lab.transforms import Hadamard

__version__ = "0.1.0"

__all__ = [
    "Hadamard",
    "QTensor",
    "QuantSpec",
    "__version__",
    "cast_spec",
    "fake_quant",
    "format_names",
    "formats",
    "fp8",
    "get_format",
    "mxfp4",
    "mxfp8",
    "nvfp4",
    "quantize",
    "quantize_dequantize",
    "scaling",
    "transforms",
]
