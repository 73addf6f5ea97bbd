"""fp4lab: numerical-stability research on 4-bit (FP4) training, in JAX.

The public API, re-exported; nothing is defined here.
"""

from fp4lab import (
    analysis,
    backends,
    formats,
    plots,
    recipes,
    report,
    scaling,
    store,
    sweep,
    telemetry,
    train,
    transforms,
)
from fp4lab.config import Config
from fp4lab.formats import format_names, get_format
from fp4lab.inject import Rule, describe, quantize_model, unquantize
from fp4lab.qconv import qconv_general_dilated
from fp4lab.qdot import qdot_general
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
from fp4lab.recipes import GemmRecipe
from fp4lab.store import load
from fp4lab.train import make_keys, make_train
from fp4lab.transforms import Hadamard

__version__ = "0.1.0"

__all__ = [
    "Config",
    "GemmRecipe",
    "Hadamard",
    "QTensor",
    "QuantSpec",
    "Rule",
    "__version__",
    "analysis",
    "backends",
    "cast_spec",
    "describe",
    "fake_quant",
    "format_names",
    "formats",
    "fp8",
    "get_format",
    "load",
    "make_keys",
    "make_train",
    "mxfp4",
    "mxfp8",
    "nvfp4",
    "plots",
    "qconv_general_dilated",
    "qdot_general",
    "quantize",
    "quantize_dequantize",
    "quantize_model",
    "recipes",
    "report",
    "scaling",
    "store",
    "sweep",
    "telemetry",
    "train",
    "transforms",
    "unquantize",
]
