"""Readable names for figures: cells, telemetry statistics and outcomes.

The runner names a cell by its overrides ("recipe=nvfp4,wgrad=bf16"); metrics and summaries
have code names ("rel_err", "loss_gap"). Figures show what a reader of a paper expects:

    cell_label("recipe=nvfp4,wgrad=bf16")   "NVFP4, Wgrad in BF16"
    cell_label("recipe=mxfp4-h16,lr=0.001")  "MXFP4-H16, lr 0.001"
    cell_label("nvfp4, first 3 in bf16")     unchanged: a label someone wrote is kept
    stat_label("rel_err")                    "relative error"
    stat_label("loss_gap")                   "loss gap to the floor (nats)"

A `labels` dict {cell name: readable name} given to a figure overrides `cell_label` for the
cells it names (and only those).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping

from fp4lab.schema import GEMMS, OPERAND_NAMES

__all__ = ["cell_label", "stat_label"]

# name, unit: the axis label is "name (unit)"
_QUANT = {
    "rel_err": ("relative error", ""),  # ||x_hat - x|| / ||x||
    "bias": ("relative bias", ""),  # mean(x_hat - x) / mean|x|, signed
    "flush": ("flushed to zero", "fraction of nonzero elements"),
    "saturated": ("saturated", "fraction of elements"),
    "underflow": ("blocks underflowed to zero", "fraction of blocks"),
    "map4": ("blocks mapped to 4", "fraction of blocks"),
}
_GRAD = {
    "cos": ("cosine to the exact gradient", ""),
    "rel_norm": ("gradient norm relative to the exact one", ""),  # ||g_q|| / ||g||
    "gnr": ("gradient-to-noise ratio", ""),  # ||g|| / ||g_q - g||
    "below_sqrt3": ("gradient-to-noise ratio below √3", "fraction"),
    "noise_zm": ("zero-mean part of the gradient noise", ""),  # spread over quant keys
    "noise_bias": ("bias of the gradient noise", ""),  # ||mean over keys - g||, corrected
    "gnr_zm": ("gradient-to-noise ratio, zero-mean noise", ""),  # ||g|| / noise_zm
}
_ACC = {
    "rel_drift": ("accumulated drift against the high-precision shadow", ""),  # relative
    "local": ("the op's own relative error", ""),
    "cos": ("cosine to the high-precision shadow", ""),
}
_OUTCOMES = {
    "loss": ("loss", "nats"),
    "eval_loss": ("held-out loss", "nats"),
    "final_loss": ("final loss", "nats"),
    "final_train_loss": ("final training loss", "nats"),
    "loss_floor": ("loss floor", "nats"),
    "target_loss": ("target loss", "nats"),
    "loss_gap": ("loss gap to the floor", "nats"),
    "eval_hp": ("held-out loss under a high-precision forward", "nats"),
    "loss_gap_hp": ("loss gap to the floor under a high-precision forward", "nats"),
    "loss_hp": ("the step's batch under a high-precision forward", "nats"),
    "grad_norm": ("gradient norm", ""),
    "loss_scale": ("loss scale", ""),
    "tokens_to_target": ("tokens to target", ""),
    "tokens_per_step": ("tokens per step", ""),
    "divergence_step": ("step of divergence", ""),
    "wall_s": ("wall time", "s"),
    "compile_s": ("compile time", "s"),
}
_KINDS = {"quant": _QUANT, "grad": _GRAD, "acc": _ACC}


# The unit of a loss by task: language models' cross-entropy in nats, the teacher-student
# regression's mean squared error (no unit of its own).
_LOSS_UNITS = {"markov": "nats", "text": "nats", "teacher": "mean squared error"}


def stat_label(
    stat: str, *, kind: str | None = None, unit: bool = True, task: str | None = None
) -> str:
    """The readable name of a telemetry statistic, series or outcome, with its unit.

    Args:
      stat: a name of `fp4lab.schema.STATS`, `GRAD_STATS` or `ACC_STATS`, a series ("loss",
        "grad_norm", "eval_loss") or a summary column ("loss_gap", "final_loss", ...).
      kind: "quant", "grad" or "acc" where a name means two things ("cos": the shadow
        gradient's unless kind="acc").
      unit: append the unit in parentheses, as an axis label shows it.
      task: the runs' task ("markov", "text", "teacher"): a loss is in nats for the language
        tasks (and when no task is given), a mean squared error for "teacher".
    Returns:
      e.g. "relative error", "loss (nats)", "saturated (fraction of elements)"; an unknown
      name unchanged.
    """
    tables = [_KINDS[kind]] if kind in _KINDS else []
    tables += [_QUANT, _GRAD, _ACC, _OUTCOMES]
    for table in tables:
        if stat in table:
            name, what = table[stat]
            if what == "nats" and task is not None:
                what = _LOSS_UNITS.get(task, "")
            return f"{name} ({what})" if unit and what else name
    return str(stat)


def cell_label(cell, labels: Mapping | None = None, *, by: str = "cell") -> str:
    """The readable name of a cell.

    A runner's name ("key=value" parts joined by commas) reads as words: a recipe by its name
    in capitals ("recipe=nvfp4-rl" -> "NVFP4-RL"), a GEMM or operand override as what runs in
    which precision ("wgrad=bf16" -> "Wgrad in BF16", "gemms={'dgrad_dy': 'fp8'}" -> "Dgrad dy
    in FP8"), any other field as "field value" ("lr=0.001" -> "lr 0.001"). A name someone
    wrote (spaces outside brackets, or no "=") is returned unchanged.

    Args:
      cell: the cell's name (or, with `by`, a value of that runs column).
      labels: {cell name: readable name}, overriding the rule above for the cells it names.
      by: the runs column `cell` comes from: a value of another column ("recipe": "nvfp4")
        reads as the part "recipe=nvfp4" would.
    """
    if labels is not None and cell in labels:
        return str(labels[cell])
    text = str(cell)
    if labels is not None and text in labels:
        return str(labels[text])
    parts = _parts(text if by == "cell" else f"{by}={text}")
    if parts is None:
        return text
    return ", ".join(_part(key, value) for key, value in parts)


_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_NAME = re.compile(r"[a-z0-9][a-z0-9_.+-]*")  # a recipe name, as opposed to a value or a spec
_CLOSE = {"(": ")", "[": "]", "{": "}"}


def _parts(text: str) -> list[tuple[str, str]] | None:
    """[(key, value)] of a "k=v,k=v" name (commas and spaces inside brackets or quotes belong
    to the value), or None for a name that is not of that form."""
    parts, start, stack, quote = [], 0, [], None
    for i, ch in enumerate(text + ","):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in _CLOSE:
            stack.append(_CLOSE[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
        elif not stack and ch.isspace():
            return None  # words: a label someone wrote
        elif not stack and ch == ",":
            key, eq, value = text[start:i].partition("=")
            if not eq or not value or not _KEY.fullmatch(key):
                return None
            parts.append((key, value))
            start = i + 1
    return None if quote or stack else parts  # an open quote or bracket: not a runner's name


def _precision(value: str) -> str:
    """A recipe value: a name in capitals ("nvfp4-rl" -> "NVFP4-RL"), None as high precision,
    anything else (a spec summary "e2m1/1x16/e4m3/sr", JSON) as it is."""
    if value == "None":
        return "high precision"
    return value.upper() if _NAME.fullmatch(value) else value


def _operand(key: str) -> str:
    """ "wgrad" -> "Wgrad", "wgrad_dy" -> "Wgrad dy"."""
    gemm, _, operand = key.partition("_")
    return gemm.capitalize() + (f" {operand}" if operand else "")


def _part(key: str, value: str) -> str:
    if key == "recipe":
        return _precision(value)
    if key in GEMMS or key in OPERAND_NAMES:
        return f"{_operand(key)} in {_precision(value)}"
    if key == "gemms":
        try:
            gemms = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            gemms = None
        if isinstance(gemms, dict) and gemms and all(isinstance(k, str) for k in gemms):
            return ", ".join(_part(k, str(v)) for k, v in gemms.items())
    return f"{key} {value}"
