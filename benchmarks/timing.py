"""Interleaved timing, shared by the benchmark scripts (imported as a sibling module).

Rows measured side by side in one process can still drift apart: a neighbour that heats the
caches, a background process that starts halfway. So every row runs once per round, in an order
shuffled each round with a fixed seed, and each call ends with block_until_ready.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import jax


def interleaved(calls: dict[str, Callable[[], Any]], reps: int) -> dict[str, list[float]]:
    """Seconds of each call of `calls[name]()` over `reps` rounds: {name: [seconds per round]}.

    The calls should be compiled and warmed up already: every call here is timed.
    """
    times = {name: [] for name in calls}
    order = list(calls)
    rng = random.Random(0)
    for _ in range(reps):
        rng.shuffle(order)  # no row always runs right after the same neighbour
        for name in order:
            t0 = time.perf_counter()
            jax.block_until_ready(calls[name]())
            times[name].append(time.perf_counter() - t0)
    return times
