"""The state a quantized op keeps in the model, as nnx Variable types.

    QuantKey      quantization-stream state: the op's base key and call counter
    AmaxHistory   delayed scaling: the last n amaxes of an operand, most recent first
    GradProbe     telemetry's gradient channel: a zero input whose cotangent is the op's
                  backward statistics (docs/architecture.md §5)
    OpStats       telemetry: the forward statistics of the op's latest call
    LayerIndex    an op standing for stacked (scanned) layers: each layer's index in the stack
    DriftTap      accumulated-drift telemetry: a zero input added to the op's output, whose
                  cotangent is the cotangent arriving at the output (dy)
    DriftCapture  accumulated-drift telemetry: the op's output of the latest call, and the local
                  error of the shadow's op

Distinct Variable types let a caller select each kind with nnx filters (e.g. differentiate
Params and GradProbes together, or split the quantization keys out of a model's state).
"""

from __future__ import annotations

from flax import nnx

__all__ = [
    "QuantKey",
    "AmaxHistory",
    "GradProbe",
    "OpStats",
    "LayerIndex",
    "DriftTap",
    "DriftCapture",
]


class QuantKey(nnx.Variable):
    """Quantization-stream state of one op: base key and call counter."""


class AmaxHistory(nnx.Variable):
    """Delayed scaling: the last n amaxes of an operand, most recent first (zeros: none yet)."""


class GradProbe(nnx.Variable):
    """A zero input of a quantized op whose cotangent carries its backward statistics."""


class OpStats(nnx.Variable):
    """Forward statistics of a quantized op's latest call."""


class LayerIndex(nnx.Variable):
    """The index of each layer of a stacked op; nnx.scan hands each layer its own."""


class DriftTap(nnx.Variable):
    """A zero input of a quantized op's output whose cotangent is the output's cotangent.

    Only the copies of a model that `fp4lab.nnx.telemetry` measures drift on hold these."""


class DriftCapture(nnx.Variable):
    """A quantized op's output of its latest call (and, in the shadow, its local error).

    Only the copies of a model that `fp4lab.nnx.telemetry` measures drift on hold these."""
