"""fp4lab: numerical-stability research on 4-bit (FP4) training, in JAX.

The public face is `fp4lab/__init__.pyi`: one spelling for each name, visible to type checkers
and IDEs. Nothing is imported with the package itself: each name is loaded from its layer on
first use (docs/architecture.md §1), so `import fp4lab` and `fp4lab --help` stay fast and a
worker process loads only what it runs.

    formats and tensors   QuantSpec, nvfp4, mxfp4, mxfp8, fp8, cast_spec, Hadamard, QTensor,
                          quantize, fake_quant, formats (format_names, get_format, grid, ...)
    GEMMs                 GemmRecipe, recipes (get, names, doc, register), qdot_general,
                          qconv_general_dilated
    models                Rule, quantize_model, describe, backend_report, unquantize,
                          telemetry
    runs                  Config, make_keys, make_train, sweep, load, replicate
    your own model        own (own.train, own.sweep: your model, loss and data, seeds, store)
    seed designs          design (design.crossed(): the quant stream crossed with the others)
    which GEMMs in BF16   diagnose(model, loss, batch) or diagnose(experiment=...)
    analysis              analysis (plots and report are its submodules)
    models and tasks      models (plain Flax NNX models), data (synthetic tasks)
"""

import os as _os  # loaded with the interpreter

from fp4lab.lazy import attach_stub

__version__ = "0.1.0"

# An install whose kernels did not build says so at the first import, once (pip shows a build's
# output only with -v; `fp4lab.core.kernel_build.say_install_failure`); elsewhere this costs
# two file checks and loads nothing.
_record = _os.path.join(_os.path.dirname(__file__), "core", "_kernels.failed")
if _os.path.exists(_record) and not _os.path.exists(_record + ".said"):
    from fp4lab.core import kernel_build as _kernel_build

    _kernel_build.say_install_failure()

# old spellings, kept for one release: name -> (module, attribute, the spelling to use)
_DEPRECATED = {
    "quantize_dequantize": (
        "fp4lab.core.quantize",
        "quantize_dequantize",
        "fl.fake_quant (the same values, with a straight-through gradient)",
    ),
    "format_names": ("fp4lab.core.formats", "format_names", "fl.formats.format_names"),
    "get_format": ("fp4lab.core.formats", "get_format", "fl.formats.get_format"),
    "train": ("fp4lab", "train", "fl.make_train, fl.make_keys and fl.Config"),
}

__getattr__, __dir__, __all__ = attach_stub(__name__, __file__, _DEPRECATED)
del attach_stub, _DEPRECATED, _os, _record
