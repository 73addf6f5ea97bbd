"""Loss spikes as outcomes: sharp excursions that recover count, not only divergences.

A run's loss series is read on the host after training (the same numbers on every machine):

    reference r_t = median of the last `window` losses before t that lie outside any event
    an event starts at step t when loss_t > factor x r_t, or loss_t is not finite
    it lasts while the loss stays above factor x r_s (r_s: the reference at its start s) or
    is not finite, and ends (recovered) at the first step where it is back below that line
    its size is max(loss over the event) / r_s (inf for a non-finite loss)

The reference is frozen during an event (an event's own losses never enter the median), so
the line that ends an event is the one that started it; after it, the median goes on from the
losses before the event. No event starts before `window` finite losses exist. An event still
open at the last step is unrecovered: the run ends in it (`diverged_at_end`). Default factor 2
and window 20: the sharp, recovering excursions that Su et al. 2025 ("Characterization and
Mitigation of Training Instabilities in Microscaling Formats", arXiv 2506.20752) count at small
scale; `fp4lab.train.divergence` (5x the first loss or
the running median, evaluated inside the run) catches blow-ups only, and a spike that recovers
within a few steps stays below it.

`events(loss)` lists the events; `summary(loss)` gives a run's columns: spikes (the count),
first_spike (its step, NaN: none), max_spike (the largest size, NaN: none), diverged_at_end,
and spike_events, every event as text "step:size:length" joined by ";" (`format_events`),
which the analysis reads back (`fp4lab.analysis.instability.parse_events`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["FACTOR", "WINDOW", "Event", "events", "summary", "format_events", "COLUMNS"]

FACTOR = 2.0  # a loss above this many times the reference starts an event
WINDOW = 20  # losses in the reference median (and needed before the first event)
COLUMNS = ("spikes", "first_spike", "max_spike", "diverged_at_end", "spike_events")


class Event(NamedTuple):
    """One excursion of the loss above factor x its reference."""

    step: int  # the first step above the line
    size: float  # max(loss in the event) / reference (inf: a non-finite loss)
    length: int  # steps above the line (to the end of the run when unrecovered)
    reference: float  # the median the line was drawn from
    recovered: bool  # back below the line before the run ended


def events(loss, factor: float = FACTOR, window: int = WINDOW) -> list[Event]:
    """The spike events of one run's loss series (see the module docstring).

    Args:
      loss: the per-step training loss, any length (NaN/inf are non-finite losses).
      factor: an event starts above factor x the reference (> 1).
      window: losses in the reference median (>= 1).
    Returns:
      The events in order of their first step.
    """
    if not factor > 1:
        raise ValueError(f"spikes.events: factor={factor!r}; must be > 1")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"spikes.events: window={window!r}; must be an int >= 1")
    loss = np.asarray(loss, np.float64).ravel()
    out: list[Event] = []
    recent: list[float] = []  # the last `window` losses outside events
    t, n = 0, len(loss)
    while t < n:
        x = loss[t]
        if len(recent) == window:
            ref = float(np.median(recent))
            line = factor * ref
            if not math.isfinite(x) or x > line:
                start, peak = t, -math.inf
                while t < n and (not math.isfinite(loss[t]) or loss[t] > line):
                    peak = max(peak, loss[t] if math.isfinite(loss[t]) else math.inf)
                    t += 1
                size = peak / ref if ref > 0 else math.inf
                out.append(Event(start, float(size), t - start, ref, t < n))
                continue
        if math.isfinite(x):
            recent = [*recent[1 - window :], float(x)] if window > 1 else [float(x)]
        t += 1
    return out


def format_events(found: list[Event]) -> str:
    """Events as text: "step:size:length" each (size to 4 significant digits), ";"-joined."""
    return ";".join(f"{e.step}:{e.size:.4g}:{e.length}" for e in found)


def summary(loss, factor: float = FACTOR, window: int = WINDOW) -> dict[str, float | int | bool]:
    """A run's spike columns: spikes, first_spike (NaN: none), max_spike (NaN: none) and
    diverged_at_end (the run ends inside an event: unrecovered, or a non-finite last loss)
    and spike_events (`format_events`)."""
    found = events(loss, factor, window)
    last = np.asarray(loss, np.float64).ravel()[-1:] if np.size(loss) else np.zeros(1)
    return {
        "spikes": len(found),
        "first_spike": float(found[0].step) if found else math.nan,
        "max_spike": max(e.size for e in found) if found else math.nan,
        "diverged_at_end": bool(
            (found and not found[-1].recovered) or not math.isfinite(float(last[0]))
        ),
        "spike_events": format_events(found),
    }
