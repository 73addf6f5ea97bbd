"""fp4lab: numerical-stability research on 4-bit (FP4) training, in JAX.

The core public API. Nothing is imported with the package itself: each name below is loaded
from its layer on first use (docs/architecture.md §1), so `import fp4lab` and `fp4lab --help`
stay fast and a worker process loads only what it runs.

    formats and tensors   QuantSpec, nvfp4, mxfp4, mxfp8, fp8, cast_spec, Hadamard, QTensor,
                          quantize, quantize_dequantize, fake_quant, format_names, get_format
    GEMMs                 GemmRecipe, recipes (get, names, doc, register), qdot_general,
                          qconv_general_dilated
    models                Rule, quantize_model, describe, backend_report, unquantize,
                          telemetry
    runs                  Config, make_keys, make_train, train, sweep, load, replicate
    your own model        own (own.train, own.sweep: your model, loss and data, seeds, store)
    which GEMMs in BF16   diagnose (callable: fl.diagnose(model, loss, batch) or experiment=)
    analysis              analysis (plots and report are its submodules)
    models and tasks      models (plain Flax NNX models), data (synthetic tasks)
"""

import importlib

__version__ = "0.1.0"

# public name -> (module, attribute); attribute None: the module itself
_API = {
    "QuantSpec": ("fp4lab.core.spec", "QuantSpec"),
    "nvfp4": ("fp4lab.core.spec", "nvfp4"),
    "mxfp4": ("fp4lab.core.spec", "mxfp4"),
    "mxfp8": ("fp4lab.core.spec", "mxfp8"),
    "fp8": ("fp4lab.core.spec", "fp8"),
    "cast_spec": ("fp4lab.core.spec", "cast_spec"),
    "Hadamard": ("fp4lab.core.hadamard", "Hadamard"),
    "QTensor": ("fp4lab.core.quantize", "QTensor"),
    "quantize": ("fp4lab.core.quantize", "quantize"),
    "quantize_dequantize": ("fp4lab.core.quantize", "quantize_dequantize"),
    "fake_quant": ("fp4lab.core.quantize", "fake_quant"),
    "format_names": ("fp4lab.core.formats", "format_names"),
    "get_format": ("fp4lab.core.formats", "get_format"),
    "formats": ("fp4lab.core.formats", None),
    "GemmRecipe": ("fp4lab.core.recipes", "GemmRecipe"),
    "recipes": ("fp4lab.core.recipes", None),
    "qdot_general": ("fp4lab.ops.dot_general", "qdot_general"),
    "qconv_general_dilated": ("fp4lab.ops.conv", "qconv_general_dilated"),
    "Rule": ("fp4lab.nnx.rules", "Rule"),
    "quantize_model": ("fp4lab.nnx.rules", "quantize_model"),
    "describe": ("fp4lab.nnx.rules", "describe"),
    "backend_report": ("fp4lab.nnx.rules", "backend_report"),
    "unquantize": ("fp4lab.nnx.rules", "unquantize"),
    "telemetry": ("fp4lab.nnx.telemetry", None),
    "Config": ("fp4lab.train.config", "Config"),
    "make_keys": ("fp4lab.train.trainer", "make_keys"),
    "make_train": ("fp4lab.train.trainer", "make_train"),
    "train": ("fp4lab.train", None),
    "sweep": ("fp4lab.sweep", None),
    "own": ("fp4lab.sweep.own", None),
    "diagnose": ("fp4lab.diagnose", None),
    "load": ("fp4lab.sweep.store", "load"),
    "replicate": ("fp4lab.sweep.replicate", "replicate"),
    "analysis": ("fp4lab.analysis", None),
    "models": ("fp4lab.models", None),
    "data": ("fp4lab.data", None),
}

__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'fp4lab' has no attribute {name!r}")
    module, attr = _API[name]
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted([*globals(), *_API])
