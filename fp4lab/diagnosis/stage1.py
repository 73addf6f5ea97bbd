"""Stage 1's samples, within a time budget, with progress that says how long is left.

A sample is one held-out batch and one quant seed at every checkpoint's weights (one
`Probe.measure` call per checkpoint). The samples run in rounds of (batch, quant seed) pairs,
each round at every checkpoint, in an order whose every prefix spreads over batches and seeds:

    (0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (1, 2), (2, 0), (2, 1), (2, 2), ...

(`rounds`). With a time budget, a round starts only when the time so far plus one round's
estimated time (a measurement's median time, the compile left out) stays within it; at least
one round runs. After the first measurement (its compile timed apart) and every round, the
progress line says how many samples are done, the seconds so far and an estimate of the
seconds the rest of the design would take, and what the time budget leaves of them when it is
shorter.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import pandas as pd

from fp4lab.diagnosis import probe, scores
from fp4lab.train.tasks import eval_batch

__all__ = ["Stage1", "rounds", "measure", "replay"]


@dataclasses.dataclass(frozen=True)
class Stage1:
    """Stage 1's samples and how they were cut."""

    samples: pd.DataFrame  # `scores.sample_rows`, every sample
    planned: int  # samples of the full design (checkpoints x batches x quant seeds)
    done: int  # samples measured (fewer than planned when the time budget ended it)
    seconds: float  # wall time of the measurements (compile included)


def rounds(batches: int, quant_seeds: int) -> list[tuple[int, int]]:
    """Every (batch, quant seed) pair, ordered by max(batch, seed), then batch, then seed."""
    pairs = [(b, q) for b in range(batches) for q in range(quant_seeds)]
    return sorted(pairs, key=lambda p: (max(p), p))


def _say(text: str) -> None:
    print(f"diagnose stage 1: {text}", file=sys.stderr, flush=True)


def measure(
    measurer: probe.Probe,
    keys: dict,
    weights: list,
    steps: list[int],
    *,
    batches: int,
    quant_seeds: int,
    time_budget: float | None = None,
    progress: bool = True,
    spent: float = 0.0,
) -> Stage1:
    """Measures every variant at `weights` (one per checkpoint `steps`) on up to `batches` x
    `quant_seeds` rounds (module docstring).

    Args:
      measurer: the gated model's `Probe`. keys: the streams (held-out batches: `data`).
      time_budget: seconds for the whole of stage 1 (None: the full design); `spent`: the
        seconds stage 1 has already taken (its short training run).
      progress: print the progress lines to stderr.
    """
    start = time.perf_counter()
    plan = rounds(batches, quant_seeds)
    planned = len(plan) * len(steps)
    gates = probe.variants(len(measurer.sites))
    rests: dict[int, object] = {}
    rows, took = [], []  # took: seconds of each measurement
    for r, (b, q) in enumerate(plan):
        now = spent + time.perf_counter() - start
        if r and time_budget is not None and now + _each(took) * len(steps) > time_budget:
            if progress:
                _say(f"the time budget ({time_budget:.0f} s) ends it after {len(rows)} of "
                     f"{planned} samples")  # fmt: skip
            break
        if q not in rests:
            rests[q] = measurer.rest_for(keys, probe.quant_keys([q])[0])
        data = eval_batch(measurer.task, keys, b)
        for step, params in zip(steps, weights, strict=True):
            t0 = time.perf_counter()
            out, shadow = measurer.measure(params, rests[q], data, gates)
            took.append(time.perf_counter() - t0)
            sample = {"checkpoint": step, "batch": b, "quant": q}
            rows.append(scores.sample_rows(out, shadow, measurer.sites, sample))
            if len(rows) == 1:  # the first measurement compiles: its run alone is the estimate
                compile_s = measurer.compile_s
                took[0] = max(took[0] - compile_s, 0.0)
                if progress:
                    left = _left(took, planned, time_budget, now + took[0] + compile_s)
                    _say(f"1/{planned} samples in {took[0] + compile_s:.0f} s ({compile_s:.0f} s "
                         f"compiling); {left}")  # fmt: skip
        if progress and r + 1 < len(plan):
            now = spent + time.perf_counter() - start
            _say(f"{len(rows)}/{planned} samples, {now:.0f} s; "
                 f"{_left(took, planned, time_budget, now)}")  # fmt: skip
    return Stage1(
        samples=pd.concat(rows, ignore_index=True),
        planned=planned,
        done=len(rows),
        seconds=time.perf_counter() - start,
    )


def _each(took: list[float]) -> float:
    """Seconds per measurement: the median after the first, else the first (less its compile)."""
    later = sorted(took[1:])
    return later[len(later) // 2] if later else took[0]


def _left(took: list[float], planned: int, budget: float | None, now: float) -> str:
    """The seconds the samples not yet measured would take, in words, and (when the time budget
    is shorter) the seconds it leaves: an estimate and the cap, each said as what it is."""
    left = _each(took) * (planned - len(took))
    text = f"the rest about {left:.0f} s"
    if budget is not None and budget - now < left:
        text += f", the time budget leaves {max(budget - now, 0.0):.0f} s of it"
    return text


def replay(measurer: probe.Probe, keys: dict, weights: list, steps: list[int], samples, gates):
    """`gates` (V, 3 * sites) measured on the samples stage 1 ran (`samples`' checkpoint,
    batch and quant columns): [(out, shadow)] of `Probe.measure`, one per sample in the order
    of `measure` (a new shape of variants: one more compile)."""
    ran = samples[["checkpoint", "batch", "quant"]].drop_duplicates()
    at = dict(zip(steps, weights, strict=True))
    rests, got = {}, []
    for (b, q), group in ran.groupby(["batch", "quant"], sort=False):
        if q not in rests:
            rests[q] = measurer.rest_for(keys, probe.quant_keys([q])[0])
        data = eval_batch(measurer.task, keys, int(b))
        for step in group["checkpoint"]:
            got.append(measurer.measure(at[int(step)], rests[q], data, gates))
    return got
