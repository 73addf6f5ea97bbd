"""How much of a rerun is compiling: a sweep run with `--seeds N`, then with `--seeds 2N`.

Both runs are `fp4lab run` processes into one fresh results folder and one fresh compile cache
(`--compile-cache`, a temporary folder), as a researcher adding seeds to a finished sweep runs
them. The second run computes only the new seeds; every cell's program comes from the caches
(the stored traced program, then jax's persistent cache), so what it still spends on a cell's
"compile" is loading that program. The table gives, for the second run, per cell: the compile
seconds (`compile_s` of its records: from building the trainer to the loaded executable) and
the seconds computing its new seeds (their `wall_s`); then the run's wall time and the share
of it spent compiling. Goal: under 10 %.

    python benchmarks/rerun.py                      # the quickstart, 4 then 8 seeds, one worker
    python benchmarks/rerun.py --seeds 2 --steps 60 # shorter
    python benchmarks/rerun.py --experiment experiments/other.py --workers 2

With `--workers` above 1 the cells' seconds overlap (and each worker has a share of the cores),
so the script gives compiling as a share of the workers' time (workers x wall) and no verdict:
the goal is measured with one worker. The load average is printed at the start and the end: on
a loaded machine both the loads and the compute slow down.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import machine  # benchmarks/timing.py

from fp4lab.sweep.store import load

GOAL = 0.10  # the second run spends under this share of its wall time compiling
ROOT = Path(__file__).resolve().parents[1]


def fp4lab_run(experiment: Path, out: Path, cache: Path, seeds: int, extra: list[str]) -> float:
    """Wall seconds of one `fp4lab run` process (its output is kept for an error message)."""
    cmd = [sys.executable, "-c", "import sys; from fp4lab.cli import main; sys.exit(main())"]
    cmd += ["run", str(experiment), "--out", str(out), "--compile-cache", str(cache)]
    cmd += ["--seeds", str(seeds), *extra]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(
            f"fp4lab run failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return wall


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiment", default=str(ROOT / "experiments" / "quickstart.py"))
    p.add_argument(
        "--seeds", type=int, default=4, help="seeds of the first run (then twice as many)"
    )
    p.add_argument("--steps", type=int, help="steps per run (default: the experiment's)")
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args(argv)
    print(machine())  # the CPU, its vector extensions and the kernel clone
    extra = ["--workers", str(args.workers)] + (
        [] if args.steps is None else ["--steps", str(args.steps)]
    )
    experiment = Path(args.experiment).resolve()

    with tempfile.TemporaryDirectory(prefix="fp4lab-rerun-") as tmp:
        out, cache = Path(tmp) / "results", Path(tmp) / "cache"
        load_start = os.getloadavg()
        first = fp4lab_run(experiment, out, cache, args.seeds, extra)
        before = set(load(out).runs["run_id"])
        load_rerun = os.getloadavg()
        wall = fp4lab_run(experiment, out, cache, 2 * args.seeds, extra)
        runs = load(out).runs
        new = runs[~runs["run_id"].isin(before)]

    print(
        f"{experiment.name}: --seeds {args.seeds}, then --seeds {2 * args.seeds} into the same "
        f"folder and caches; {args.workers} worker(s); first run {first:.1f} s\n"
    )
    print("| cell (second run) | new seeds | compile s | computing s |")
    print("|---|---:|---:|---:|")
    compile_s = computing = 0.0
    for cell, group in new.groupby("cell", sort=False):
        c = float(group["compile_s"].max())  # every record of a cell carries its compile time
        w = float(group["wall_s"].sum())  # per-seed shares of the vmapped calls
        compile_s, computing = compile_s + c, computing + w
        print(f"| {cell} | {len(group)} | {c:.2f} | {w:.1f} |")
    if args.workers == 1:
        share = compile_s / wall
        rest = wall - compile_s - computing
        print(
            f"\nsecond run: {wall:.1f} s wall; compiling {compile_s:.1f} s ({100 * share:.1f} "
            f"%), computing {computing:.1f} s, the rest (start-up, writing, figures) {rest:.1f} s"
        )
        verdict = "met" if share < GOAL else "NOT met"
        print(f"goal: compiling < {100 * GOAL:.0f} % of the second run's wall time -> {verdict}")
    else:  # the workers' seconds overlap: a share of their time, not of the wall's
        held = args.workers * wall
        print(
            f"\nsecond run: {wall:.1f} s wall; summed over its {args.workers} workers, "
            f"compiling {compile_s:.1f} s and computing {computing:.1f} s: compiling is "
            f"{100 * compile_s / held:.1f} % of the workers' {held:.1f} s"
        )
        print("goal (measured with one worker): run without --workers for the verdict")
    ends = ", ".join(f"{a:.2f}" for a in os.getloadavg())
    print(
        f"load average: {load_start[0]:.2f} at the start, {load_rerun[0]:.2f} before the "
        f"second run, {ends} at the end"
    )


if __name__ == "__main__":
    main()
