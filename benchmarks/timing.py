"""Interleaved timing, shared by the benchmark scripts (imported as a sibling module).

Rows measured side by side in one process can still drift apart: a neighbour that heats the
caches, a background process that starts halfway. So every row runs once per round, in an order
shuffled each round with a fixed seed, and each call ends with block_until_ready. A goal on the
ratio of two rows is judged on their per-round ratios (`round_ratios`): their median, and the
sign test's interval of that median (`median_interval`), so a verdict says when the rounds
cannot tell whether the goal holds (`goal_verdict`). Every benchmark's header names the machine
(`machine`): the CPU model, its vector extensions, and which clone of the quantizer kernel ran.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax

# the vector extensions that decide a kernel's speed, as /proc/cpuinfo names them
ISA = ("sse2", "sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "asimd", "sve")


def machine() -> str:
    """One line for a benchmark's header: date, CPU model, its vector extensions of `ISA`, the
    cores, the load average, and the clone of the quantizer kernel that runs (FP4LAB_CPU_CLONE
    where it forces one; "jnp reference" without the kernel)."""
    from fp4lab.core import cpu_kernels, kernel_route

    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware") and model == platform.machine():
                    model = value.strip()
                elif key.strip() in ("flags", "Features"):
                    flags |= set(value.split())
    except OSError:
        pass
    if not (model and model != platform.machine()) and platform.system() == "Darwin":
        model = os.popen("sysctl -n machdep.cpu.brand_string").read().strip() or model
    isa = " ".join(f for f in ISA if f in flags) or "(not listed)"
    kernel = kernel_route.enabled() or "none: the jnp reference"
    forced = os.environ.get("FP4LAB_CPU_CLONE")
    clone = f"{kernel} (forced by FP4LAB_CPU_CLONE={forced})" if forced else f"{kernel} (widest)"
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (
        f"{datetime.date.today()}; CPU: {model}, {platform.machine()}, ISA {isa}; "
        f"{os.cpu_count()} cores, load {load[0]:.1f}; quantizer kernel clone: {clone} "
        f"of {', '.join(cpu_kernels.clones()) or 'none'}"
    )


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


def round_ratios(num: list[float], den: list[float]) -> list[float]:
    """The per-round ratios num[i] / den[i] of two rows timed in the same `interleaved` rounds:
    pairing by round cancels what a round shares (a background process, the caches' state)."""
    if len(num) != len(den):
        raise ValueError(f"rows of {len(num)} and {len(den)} rounds cannot be paired")
    return [a / b for a, b in zip(num, den, strict=True)]


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """The sign test's distribution-free interval for the median of independent values.

    The order statistics x_(k) and x_(n+1-k) of the sorted values, with k the largest for
    which P(k <= B <= n - k) >= `level`, B ~ Binomial(n, 1/2): the chance that the median lies
    between them, whatever the distribution (continuous). None when even the smallest and the
    largest value cover less than `level` (fewer than 6 values at 95 %). It assumes the values
    independent; rounds that drift together (a machine slowly loading up) make it too narrow.
    """
    if not 0 < level < 1:
        raise ValueError(f"level={level!r}; must lie in (0, 1)")
    x = sorted(values)
    n = len(x)
    k = None
    for j in range(1, n // 2 + 1):
        if sum(math.comb(n, i) for i in range(j, n - j + 1)) / 2**n < level:
            break
        k = j
    return None if k is None else (x[k - 1], x[n - k])


def goal_verdict(
    ratios: list[float], goal: float, level: float = 0.95, *, at_least: bool = False
) -> str:
    """A "ratio <= goal" verdict from per-round ratios ("ratio >= goal" with `at_least`): "met"
    when the median's interval (`median_interval`) lies on the goal's side of it (the goal
    itself included), "NOT met" when it lies on the other side, and "at the goal" when it holds
    the goal (the rounds cannot tell); with too few rounds for an interval, the median alone
    decides and the verdict says so."""

    def holds(r: float) -> bool:
        return r >= goal if at_least else r <= goal

    median = statistics.median(ratios)
    ci = median_interval(ratios, level)
    if ci is None:
        plain = "met" if holds(median) else "NOT met"
        return f"{plain} (median of {len(ratios)} rounds, too few for a {100 * level:g} % interval)"
    lo, hi = ci
    shown = (
        f"{100 * level:g} % interval of the median [{lo:.2f}, {hi:.2f}] over {len(ratios)} rounds"
    )
    if holds(lo) and holds(hi):
        return f"met ({shown})"
    if not holds(lo) and not holds(hi):
        return f"NOT met ({shown})"
    return f"at the goal: not decided ({shown} holds {goal})"
