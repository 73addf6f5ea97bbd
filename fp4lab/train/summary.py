"""Host-side summaries of one seed's run arrays: the numbers of its row in a runs table."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fp4lab.train import spikes
from fp4lab.train.config import Config
from fp4lab.train.divergence import DIVERGENCE_KINDS
from fp4lab.train.tasks import Task, make_task

__all__ = ["target_of", "tokens_to_target", "summarize"]


def target_of(cfg: Config, floor: float) -> float:
    """The tokens-to-target threshold: target_loss, or floor + target_gap, or NaN (none)."""
    if cfg.target_loss is not None:
        return cfg.target_loss
    if cfg.target_gap is not None:
        return floor + cfg.target_gap
    return math.nan


def tokens_to_target(loss: np.ndarray, target: float, window: int, tokens_per_step: int) -> float:
    """Tokens consumed when the mean of the last `window` losses (the training loss, or the
    `loss_hp` series) first reaches `target` (NaN: never, or no target). Steps with a NaN loss
    never count as reached."""
    loss = np.asarray(loss, np.float64)
    if not math.isfinite(target) or len(loss) < window:
        return math.nan
    smooth = np.convolve(loss, np.ones(window) / window, mode="valid")  # smooth[i]: steps i..i+w-1
    hit = np.flatnonzero(smooth <= target)
    return math.nan if not len(hit) else float((hit[0] + window) * tokens_per_step)


def summarize(cfg: Config, arrays: dict[str, Any], task: Task | None = None) -> dict[str, Any]:
    """One seed's arrays -> the summary numbers of its row in the runs table.

    Two measurements of the trained weights: under the run's own recipe (final_loss,
    loss_gap; tokens_to_target reads the training loss, which is under the recipe too) and
    under a high-precision forward (eval_hp, loss_gap_hp); with `Config.target_on="hp"`
    tokens_to_target reads the per-step high-precision series `loss_hp` instead. `measure`
    names the first one's
    forward ("recipe"), so that a comparison across a late switch of precision can say which
    it uses: part of a "recovery" after switching to BF16 is a change of measurement.
    The spike columns (`fp4lab.train.spikes.summary`: spikes, first_spike, max_spike,
    diverged_at_end) count the loss's excursions above twice its running median, recovered
    or not. `learned` is False when the training loss never fell below its first value (the verdict
    and `fp4lab show` say "did not learn").

    Args:
      cfg: the run's Config. arrays: one seed's `train(keys)` output (host arrays).
      task: the task (built from cfg when None).
    Returns:
      {name: number} for the runs table.
    """
    task = task or make_task(cfg)
    loss = np.asarray(arrays["loss"], np.float64)
    tail = loss[-max(len(loss) // 10, 1) :]
    final = float(np.asarray(arrays["eval_loss"])) if "eval_loss" in arrays else np.mean(tail)
    eval_hp = float(np.asarray(arrays["eval_hp"])) if "eval_hp" in arrays else math.nan
    target = target_of(cfg, task.floor)
    div_step = int(np.asarray(arrays["diverged_step"]))
    toward = np.asarray(arrays["loss_hp"], np.float64) if cfg.target_on == "hp" else loss
    return {
        "final_loss": float(final),
        "final_train_loss": float(np.mean(tail)),
        "initial_loss": float(loss[0]) if len(loss) else math.nan,
        "eval_loss": float(np.asarray(arrays["eval_loss"])) if "eval_loss" in arrays else math.nan,
        "loss_floor": task.floor,
        "loss_gap": final - task.floor,
        "eval_hp": eval_hp,
        "loss_gap_hp": eval_hp - task.floor,
        "measure": "recipe",
        "diverged": div_step >= 0,
        "divergence_step": float(div_step) if div_step >= 0 else math.nan,
        "divergence_kind": DIVERGENCE_KINDS[int(np.asarray(arrays["divergence_kind"]))],
        "learned": bool(np.any(loss[1:] < loss[0])),  # NaN compares False: not learned
        "target_loss": target,
        "tokens_to_target": tokens_to_target(
            toward, target, cfg.target_window, task.tokens_per_step
        ),
        "tokens_per_step": task.tokens_per_step,
        **spikes.summary(loss),
    }
