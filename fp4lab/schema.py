"""The names every layer shares, defined once; no dependencies.

    STREAMS        the independent seed streams of a run: init, data, quant; SEED_LIMIT bounds
                   their seeds
    GEMMS          the three GEMMs of a linear layer's training step, and OPERANDS[gemm] their two
                   operands (`fprop_x`, ... are `operand_name(gemm, operand)`)
    BACKWARD_MODES what the backward GEMMs consume (docs/architecture.md §3)
    BACKENDS       how the GEMMs run: simulated (the reference), native, auto
    STATS          per-operand quantization statistics, in the order of the telemetry vectors;
                   FWD_OPERANDS / BWD_OPERANDS the (gemm, operand) rows of the forward and backward
                   tables; GRAD_STATS the per-parameter shadow statistics, GRAD_NOISE_STATS
                   those of the draws of the quantization noise (`Config.noise_keys`, optional);
                   ACC_STATS the accumulated-drift statistics of an op's output (fwd) and its
                   cotangent (bwd)
    SQRT3          the gradient-to-noise threshold of Chmiel et al. 2025 (arXiv 2505.19115)
    RECORDED_BEFORE  config fields added after run records were first stored, with the value
                   every record made before the field existed was computed with

Metric keys are flat "/"-separated strings that map one to one onto tidy rows:

    quant/<layer>/<gemm>/<operand>/<stat>      a quantized operand's statistic
    grad/<layer>/<stat>                        a parameter gradient against the exact shadow
    acc/<layer>/<direction>/<stat>             an op's output (fwd) or output cotangent (bwd)
                                               against the high-precision shadow's
    depth/<layer>                              the layer's position in the forward's order

`quant_key`, `grad_key`, `acc_key` build them and `parse_key` reads them back. `check_choice` is
the one validator every config class uses for its named fields, `check_number` for its numeric
ones (type, finiteness and range), and `did_you_mean` the "did you mean" hint both add to a
misspelled name.
"""

from __future__ import annotations

import difflib
import math
import numbers
from typing import Any, NamedTuple

__all__ = [
    "STREAMS",
    "SIGNALS",
    "SEED_COLUMNS",
    "SEED_LIMIT",
    "GEMMS",
    "OPERANDS",
    "OPERAND_NAMES",
    "BACKWARD_MODES",
    "BACKENDS",
    "STATS",
    "FWD_OPERANDS",
    "BWD_OPERANDS",
    "GRAD_STATS",
    "GRAD_NOISE_STATS",
    "ACC_STATS",
    "ACC_OPERANDS",
    "SQRT3",
    "RECORDED_BEFORE",
    "MetricKey",
    "operand_name",
    "quant_key",
    "grad_key",
    "acc_key",
    "depth_key",
    "parse_key",
    "check_choice",
    "check_number",
    "check_fields",
    "did_you_mean",
    "RUNS_COLUMNS",
    "RUNS_CONFIG",
    "METRICS_COLUMNS",
]

STREAMS = ("init", "data", "quant")
# the per-step instability signals a record keeps when Config.signals asks (fp4lab.train.signals;
# the last two, the built-in LMs' own (Task.signals), only for those)
SIGNALS = ("update_ratio", "norm_max", "attn_logit_max", "logit_z")
SEED_COLUMNS = tuple(f"seed_{s}" for s in STREAMS)  # a stream's seed in a runs table
# a stream's seed lies in [0, SEED_LIMIT): jax.random.key(seed) keeps the seed's low 32 bits,
# so 2**32 + 1 (or -1) would give the stream of 1 (of 2**32 - 1) under another run id
SEED_LIMIT = 2**32

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
# with K >= 2 draws of the quantization keys (`Config.noise_keys`; only then): the zero-mean
# part's norm, the bias's norm and ||g|| / noise_zm (`fp4lab.nnx.noise`); also grad/<layer>/<stat>
GRAD_NOISE_STATS = ("noise_zm", "noise_bias", "gnr_zm")
# accumulated drift against the high-precision shadow: fwd of the op's output y, bwd of the
# cotangent dy arriving at it; "local" is the error the op alone adds when fed the shadow's input
ACC_STATS = {"fwd": ("rel_drift", "local"), "bwd": ("rel_drift", "cos")}
ACC_OPERANDS = {"fwd": "y", "bwd": "dy"}  # what each direction compares (a tidy row's operand)
SQRT3 = math.sqrt(3.0)  # training stalls below ||g|| / ||g_q - g|| = sqrt(3) (Chmiel et al. 2025)

# `Config.from_dict` reads a stored config that lacks one of these fields with this value, and
# the store leaves the field out of run ids at it, so the records made before the field keep
# their ids and reproduce. A field whose default is another value (telemetry_stats: "fused")
# gives new runs new ids; experiment files of committed results pin the old value.
RECORDED_BEFORE: dict[str, Any] = {
    "scan_layers": False,
    "telemetry_stats": "reference",
    "task_file": "",
    "task_args": [],
    "noise_keys": 0,
    "target_on": "train",
    "pad_seeds": True,
    "pad": False,
    "qk_norm": False,
    "z_loss": 0.0,
    "activation": "gelu",
    "signals": False,
}


class MetricKey(NamedTuple):
    """A parsed metric key; `grad/` keys have gemm "wgrad" and operand "grad", `acc/` keys the
    direction ("fwd" | "bwd") as gemm and what it compares ("y" | "dy") as operand."""

    kind: str  # "quant" | "grad" | "acc"
    layer: str
    gemm: str
    operand: str
    stat: str


def quant_key(layer: str, gemm: str, operand: str, stat: str) -> str:
    return f"quant/{layer}/{gemm}/{operand}/{stat}"


def grad_key(layer: str, stat: str) -> str:
    return f"grad/{layer}/{stat}"


def acc_key(layer: str, direction: str, stat: str) -> str:
    return f"acc/{layer}/{direction}/{stat}"


def depth_key(layer: str) -> str:
    """The key of a layer's depth: its position in the forward's order of quantized ops."""
    return f"depth/{layer}"


def parse_key(key: str) -> MetricKey | None:
    """The parts of a `quant/...`, `grad/...` or `acc/...` key; None for any other key."""
    parts = key.split("/")
    if parts[0] == "acc" and len(parts) == 4 and parts[2] in ACC_OPERANDS:
        return MetricKey("acc", parts[1], parts[2], ACC_OPERANDS[parts[2]], parts[3])
    if parts[0] == "quant" and len(parts) == 5:
        return MetricKey(*parts)
    if parts[0] == "grad" and len(parts) == 3:
        return MetricKey("grad", parts[1], "wgrad", "grad", parts[2])
    return None


def check_choice(
    owner: str, field: str, value: Any, allowed, error: type[Exception] = ValueError
) -> None:
    """Raises `error("<owner>.<field>=<value>; allowed: ...")` unless value is in `allowed`; a
    misspelled string gets a "did you mean" hint."""
    try:
        ok = value in allowed
    except TypeError:  # an unhashable value and a set of names
        ok = False
    if not ok:
        hint = did_you_mean(value, allowed)
        raise error(f"{owner}.{field}={value!r}; allowed: {', '.join(map(repr, allowed))}{hint}")


def check_fields(owner: str, value: Any, allowed) -> dict:
    """`value` as a dict of `owner`'s fields (plain JSON read back): a ValueError for anything
    but a dict, and for unknown field names (each with a "did you mean" hint)."""
    if not isinstance(value, dict):
        raise ValueError(f"{owner}: expected a dict of its fields, got {value!r}")
    allowed = list(allowed)
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        hint = "".join(did_you_mean(u, allowed) for u in unknown)
        raise ValueError(f"{owner} has no field {unknown}; allowed: {', '.join(allowed)}{hint}")
    return dict(value)


def did_you_mean(name: Any, allowed) -> str:
    """ "; did you mean 'x'?" for the closest string in `allowed` (difflib), else ""."""
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, [a for a in allowed if isinstance(a, str)], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_number(
    owner: str,
    field: str,
    value: Any,
    *,
    integer: bool = False,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    optional: bool = False,
    error: type[Exception] = ValueError,
) -> None:
    """Raises `error` naming `<owner>.<field>`, the value and what is allowed, unless `value` is
    a number of the right kind (an int when `integer`; never a bool), finite, and inside the
    interval from `low` to `high` (closed ends unless `low_open` / `high_open`). `optional`
    admits None.
    """
    if value is None and optional:
        return
    kind = "an int" if integer else "a float"
    bounds = []
    if low is not None:
        bounds.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        bounds.append(f"{'<' if high_open else '<='} {high:g}")
    allowed = f"{kind}{' ' + ' and '.join(bounds) if bounds else ''}"
    allowed += " or None" if optional else ""
    wanted = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, wanted):
        raise error(f"{owner}.{field}={value!r} ({type(value).__name__}); allowed: {allowed}")
    bad = not math.isfinite(value)
    if low is not None:
        bad = bad or (value <= low if low_open else value < low)
    if high is not None:
        bad = bad or (value >= high if high_open else value > high)
    if bad:
        raise error(f"{owner}.{field}={value!r}; allowed: {allowed}")


# The two tables of a results folder (`fp4lab.load(folder)`, `fp4lab.own.sweep`), documented in
# docs/schema.md: column -> (type, meaning, what fills it). The runs table also has one column
# per Config field (task, recipe, steps, ...: `RUNS_CONFIG`).
_LOAD = "fp4lab.load(folder).runs"
_SUMMARY = "fp4lab.train.summary.summarize, in fp4lab.load(folder).runs"
RUNS_COLUMNS: dict[str, tuple[str, str, str]] = {
    "run_id": ("str", "the run's id (hash of config, seeds, data, numerics)", _LOAD),
    "experiment": ("str", "the experiment's name", _LOAD),
    "cell": ("str", "the cell's label in the experiment file", _LOAD),
    "status": ("str", '"ok" or "failed"', _LOAD),
    **{
        c: ("int", f"the {s} stream's seed", _LOAD)
        for s, c in zip(STREAMS, SEED_COLUMNS, strict=True)
    },
    "final_loss": (
        "float",
        "held-out loss under the run's recipe (else last 10 % train)",
        _SUMMARY,
    ),
    "final_train_loss": ("float", "mean train loss of the last 10 % of steps", _SUMMARY),
    "initial_loss": ("float", "the training loss at step 0 (LR sensitivity's cap)", _SUMMARY),
    "eval_loss": ("float", "held-out loss under the run's recipe (NaN: none)", _SUMMARY),
    "loss_floor": ("float", "the task's optimum (NaN: unknown)", _SUMMARY),
    "loss_gap": ("float", "final_loss - loss_floor", _SUMMARY),
    "eval_hp": ("float", "held-out loss of the same weights, high-precision forward", _SUMMARY),
    "loss_gap_hp": ("float", "eval_hp - loss_floor", _SUMMARY),
    "measure": ("str", 'the forward final_loss is measured under ("recipe")', _SUMMARY),
    "diverged": (
        "bool",
        "a non-finite loss, or one above spike_factor x its first loss or x its running median",
        _SUMMARY,
    ),
    "divergence_step": ("float", "the step of its first divergence (NaN: none)", _SUMMARY),
    "divergence_kind": ("str", '"", "nonfinite" or "spike"', _SUMMARY),
    "spikes": (
        "int",
        "loss spike events: the loss above 2x the median of its last 20 (fp4lab.train.spikes)",
        _SUMMARY,
    ),
    "first_spike": ("float", "the step of the first spike event (NaN: none)", _SUMMARY),
    "max_spike": ("float", "the largest spike's peak / its median (NaN: none)", _SUMMARY),
    "diverged_at_end": ("bool", "the run ends inside a spike event (unrecovered)", _SUMMARY),
    "spike_events": ("str", 'every spike event, "step:size:length" joined by ";"', _SUMMARY),
    "learned": (
        "bool",
        'the training loss fell by more than its batch-to-batch noise (False: "did not learn"; '
        "NaN: under 8 steps, too short to tell)",
        _SUMMARY,
    ),
    "target_loss": ("float", "the tokens-to-target threshold (NaN: none)", _SUMMARY),
    "tokens_to_target": (
        "float",
        "tokens until the smoothed loss (Config.target_on) reached it (NaN: never)",
        _SUMMARY,
    ),
    "tokens_per_step": ("int", "tokens (or examples) per step", _SUMMARY),
    "compile_s": ("float", "the cell's compile seconds (0: cached)", _SUMMARY),
    "no_seam": (
        "str",
        "the model's modules that multiply their own parameters without a seam (a custom "
        'jnp.dot or @) and stay in high precision, comma-separated ("": none)',
        "fp4lab.sweep.compute.compute_cell, in fp4lab.load(folder).runs",
    ),
    "wall_s": ("float", "seconds of the run (its share of its call)", _LOAD),
}
RUNS_CONFIG = ("a Config field", "the run's config", _LOAD)
_METRICS = "fp4lab.load(folder).metrics"
METRICS_COLUMNS: dict[str, tuple[str, str, str]] = {
    "run_id": ("str", "the run's id (a runs table row)", _METRICS),
    "step": ("int", "the optimizer step (0-based)", _METRICS),
    "metric": (
        "str",
        "loss, grad_norm, loss_scale, loss_hp (Config.target_on), update_ratio, norm_max and, "
        "for the LMs, attn_logit_max and logit_z (Config.signals) or a telemetry key (quant/...)",
        _METRICS,
    ),
    "value": ("float", "the metric's value at that step", _METRICS),
}
