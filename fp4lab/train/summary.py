"""Host-side summaries of one seed's run arrays: the numbers of its row in a runs table."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fp4lab.train import spikes
from fp4lab.train.config import Config
from fp4lab.train.divergence import DIVERGENCE_KINDS
from fp4lab.train.tasks import Task, make_task

__all__ = ["target_of", "tokens_to_target", "batch_noise", "learned", "summarize"]

MIN_LEARN_STEPS = 8  # fewer finite steps: too short to tell learning from the noise


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


def batch_noise(loss) -> float:
    """The SD of one batch's loss about its trend: 1.4826 * MAD(diff(loss)) / sqrt(2), from
    step-to-step differences (robust to a fast first drop)."""
    d = np.diff(np.asarray(loss, np.float64))
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2))


def learned(loss) -> float:
    """Whether the training loss fell by more than its batch-to-batch noise: 1.0, 0.0, or NaN
    for a run too short to tell (fewer than `MIN_LEARN_STEPS` steps).

    With y the losses before the first non-finite one (n of them; a run of `MIN_LEARN_STEPS`
    steps or more with fewer finite ones did not learn), w = max(n // 4, 2) steps a window,
    and the noise s = 1.4826 * MAD(diff(y)) / sqrt(2) (the SD of one batch's loss about the
    trend, from step-to-step differences, robust to a fast first drop):

        learned  <=>  mean(y[:w]) - mean(y[-w:])  >  s * max(1, 4 * sqrt(2 / w))

    a drop larger than one batch's noise and than 4 standard errors of the difference of the
    two windows' means. A model at chance, or one whose steps do not move it (lr 1e-12), drops
    by about 0 +- s * sqrt(2 / w): not learned. A loss that does not vary (one fixed batch)
    learned when it fell by more than 1e-4 of its early mean.
    """
    loss = np.asarray(loss, np.float64).ravel()
    if len(loss) < MIN_LEARN_STEPS:
        return math.nan
    bad = np.flatnonzero(~np.isfinite(loss))
    y = loss[: bad[0]] if len(bad) else loss
    if len(y) < MIN_LEARN_STEPS:
        return 0.0
    w = max(len(y) // 4, 2)
    noise = batch_noise(y)
    drop = np.mean(y[:w]) - np.mean(y[-w:])
    floor = 1e-4 * abs(np.mean(y[:w]))  # a loss constant but for float rounding: not learned
    return float(drop > max(noise * max(1.0, 4.0 * math.sqrt(2.0 / w)), floor))


def _flag(x: float):
    return x if math.isnan(x) else bool(x)


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
    diverged_at_end, spike_events) count the loss's excursions above twice its running
    median, recovered or not.
    `learned` is False when the training loss did not fall by more than its batch-to-batch
    noise (`learned` above; the verdict, `fp4lab show`, the report and the run's summary then
    say "did not learn" and give the cell no verdict words), NaN for a run too short to tell.

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
        "learned": _flag(learned(loss)),
        "target_loss": target,
        "tokens_to_target": tokens_to_target(
            toward, target, cfg.target_window, task.tokens_per_step
        ),
        "tokens_per_step": task.tokens_per_step,
        **spikes.summary(loss),
    }
