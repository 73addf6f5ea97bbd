"""The verdict's cost on the committed randomness-vs-error outcomes (3744 runs, 4 cells, 16
judged rows, 10^6 generalized draws per cell and contrast). Goal: under 10 s.

    python benchmarks/verdict.py              # 5 rounds, the median and the range
    python benchmarks/verdict.py --rounds 3 --draws 200000

Each round judges the runs with another Monte Carlo seed; the words of every round are
printed as one set (they must not depend on the seed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import pandas as pd
from timing import machine  # benchmarks/timing.py

from fp4lab.analysis import verdicts

GOAL_S = 10.0
OUTCOMES = Path(__file__).resolve().parents[1] / "results/randomness_vs_error/outcomes.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--draws", type=int, default=verdicts.DRAWS)
    args = parser.parse_args()
    print(machine())  # the CPU, its vector extensions and the kernel clone
    runs = pd.read_csv(OUTCOMES)
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {len(runs)} runs, {args.draws} draws")
    seconds, words = [], set()
    for seed in range(args.rounds):
        start = time.perf_counter()
        table = verdicts.verdict(runs, "loss_gap", draws=args.draws, seed=seed)
        seconds.append(time.perf_counter() - start)
        words.add(tuple(table["verdict"]))
    median = statistics.median(seconds)
    met = "met" if median < GOAL_S else "NOT met"
    spread = f"[{min(seconds):.2f}, {max(seconds):.2f}]"
    goal = f"goal < {GOAL_S:.0f} s: {met}"
    print(f"verdict: median {median:.2f} s, range {spread}, {args.rounds} rounds ({goal})")
    print(f"words identical across the {args.rounds} Monte Carlo seeds: {len(words) == 1}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
