"""The names every layer shares, defined once; no dependencies.

    STREAMS        the independent seed streams of a run: init, data, quant
    GEMMS          the three GEMMs of a linear layer's training step, and OPERANDS[gemm] their two
                   operands (`fprop_x`, ... are `operand_name(gemm, operand)`)
    BACKWARD_MODES what the backward GEMMs consume (docs/architecture.md §3)
    BACKENDS       how the GEMMs run: simulated (the reference), native, auto
    STATS          per-operand quantization statistics, in the order of the telemetry vectors;
                   FWD_OPERANDS / BWD_OPERANDS the (gemm, operand) rows of the forward and backward
                   tables; GRAD_STATS the per-parameter shadow statistics
    SQRT3          the gradient-to-noise threshold of Chmiel et al. 2025 (arXiv 2505.19115)

Metric keys are flat "/"-separated strings that map one to one onto tidy rows:

    quant/<layer>/<gemm>/<operand>/<stat>      a quantized operand's statistic
    grad/<layer>/<stat>                        a parameter gradient against the exact shadow

`quant_key`, `grad_key` build them and `parse_key` reads them back. `check_choice` is the one
validator every config class uses for its named fields.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

__all__ = [
    "STREAMS",
    "SEED_COLUMNS",
    "GEMMS",
    "OPERANDS",
    "OPERAND_NAMES",
    "BACKWARD_MODES",
    "BACKENDS",
    "STATS",
    "FWD_OPERANDS",
    "BWD_OPERANDS",
    "GRAD_STATS",
    "SQRT3",
    "MetricKey",
    "operand_name",
    "quant_key",
    "grad_key",
    "parse_key",
    "check_choice",
]

STREAMS = ("init", "data", "quant")
SEED_COLUMNS = tuple(f"seed_{s}" for s in STREAMS)  # a stream's seed in a runs table

GEMMS = ("fprop", "dgrad", "wgrad")
OPERANDS = {"fprop": ("x", "w"), "dgrad": ("dy", "w"), "wgrad": ("x", "dy")}


def operand_name(gemm: str, operand: str) -> str:
    """The recipe field of one GEMM operand, e.g. ("wgrad", "dy") -> "wgrad_dy"."""
    return f"{gemm}_{operand}"


OPERAND_NAMES = tuple(operand_name(g, o) for g in GEMMS for o in OPERANDS[g])
BACKWARD_MODES = ("quantized", "dequantized", "high_precision")
BACKENDS = ("simulated", "native", "auto")

STATS = ("rel_err", "bias", "flush", "saturated", "underflow", "map4")
FWD_OPERANDS = (("fprop", "x"), ("fprop", "w"))
BWD_OPERANDS = (("dgrad", "dy"), ("dgrad", "w"), ("wgrad", "x"), ("wgrad", "dy"))
GRAD_STATS = ("cos", "rel_norm", "gnr", "below_sqrt3")
SQRT3 = math.sqrt(3.0)  # training stalls below ||g|| / ||g_q - g|| = sqrt(3) (Chmiel et al. 2025)


class MetricKey(NamedTuple):
    """A parsed metric key; `grad/` keys have gemm "wgrad" and operand "grad"."""

    kind: str  # "quant" | "grad"
    layer: str
    gemm: str
    operand: str
    stat: str


def quant_key(layer: str, gemm: str, operand: str, stat: str) -> str:
    return f"quant/{layer}/{gemm}/{operand}/{stat}"


def grad_key(layer: str, stat: str) -> str:
    return f"grad/{layer}/{stat}"


def parse_key(key: str) -> MetricKey | None:
    """The parts of a `quant/...` or `grad/...` key; None for any other key."""
    parts = key.split("/")
    if parts[0] == "quant" and len(parts) == 5:
        return MetricKey(*parts)
    if parts[0] == "grad" and len(parts) == 3:
        return MetricKey("grad", parts[1], "wgrad", "grad", parts[2])
    return None


def check_choice(
    owner: str, field: str, value: Any, allowed, error: type[Exception] = ValueError
) -> None:
    """Raises `error("<owner>.<field>=<value>; allowed: ...")` unless value is in `allowed`."""
    if value not in allowed:
        raise error(f"{owner}.{field}={value!r}; allowed: {', '.join(map(repr, allowed))}")
