# ruff: noqa: I001  (grouped by job, as the package docstring lists them)
"""fp4lab's public face: every name `import fp4lab as fl` offers, one spelling each.

Type checkers and IDEs read this stub; at run time `fp4lab/__init__.py` loads each name from the
module below on first use (`fp4lab.lazy.attach_stub`), so `import fp4lab` loads no jax.
"""

__version__: str

# formats and tensors
from fp4lab.core import formats as formats
from fp4lab.core.hadamard import Hadamard as Hadamard
from fp4lab.core.quantize import QTensor as QTensor
from fp4lab.core.quantize import fake_quant as fake_quant
from fp4lab.core.quantize import quantize as quantize
from fp4lab.core.spec import QuantSpec as QuantSpec
from fp4lab.core.spec import cast_spec as cast_spec
from fp4lab.core.spec import fp8 as fp8
from fp4lab.core.spec import mxfp4 as mxfp4
from fp4lab.core.spec import mxfp8 as mxfp8
from fp4lab.core.spec import nvfp4 as nvfp4

# GEMMs
from fp4lab.core import recipes as recipes
from fp4lab.core.recipes import GemmRecipe as GemmRecipe
from fp4lab.ops.conv import qconv_general_dilated as qconv_general_dilated
from fp4lab.ops.dot_general import qdot_general as qdot_general

# models under rules
from fp4lab.nnx import telemetry as telemetry
from fp4lab.nnx.rules import Rule as Rule
from fp4lab.nnx.rules import backend_report as backend_report
from fp4lab.nnx.rules import describe as describe
from fp4lab.nnx.rules import quantize_model as quantize_model
from fp4lab.nnx.rules import unquantize as unquantize

# runs, sweeps and results
from fp4lab import sweep as sweep
from fp4lab.sweep import design as design
from fp4lab.sweep import own as own
from fp4lab.sweep.fresh import replicate as replicate
from fp4lab.sweep.store import load as load
from fp4lab.train.config import Config as Config
from fp4lab.train.trainer import make_keys as make_keys
from fp4lab.train.trainer import make_train as make_train

# which GEMMs to keep in high precision
from fp4lab.diagnosis.study import diagnose as diagnose

# analysis, plain models and synthetic tasks
from fp4lab import analysis as analysis
from fp4lab import data as data
from fp4lab import models as models
