"""`--progress-every K` against no step reports, side by side: where its cost goes.

One cell of the quickstart's kind (the LM, d_model 64, 2 blocks under a scan, NVFP4, telemetry
every 25 steps; `--steps` steps, 2 seeds) through the sweep's own `compute_cell`, three ways:

  run       the cell called again, compiled already: the reports' own cost per run
  compile   a first call in a process without caches: compile + run
  rerun     a first call in a new process whose caches on disk hold the cell, each program
            traced once before (what a rerun, an added seed or a worker process pays; timed
            inside child processes): both variants come from jax's persistent cache and the
            stored traced programs, since the reports go through a CPU kernel's queue
            (`fp4lab.sweep.step_reports.report_step`), not a Python callback

Each measurement runs in a process of its own (a child of this one, which interleaves the
rounds and prints the table), so that no measurement finds another's programs in memory.

Each row's two variants run once per round, alternating which goes first; the table gives
the median seconds and the median of the per-round ratios (reports / none) with the sign
test's interval (6 rounds or more). Goal: reports cost <= 10 % (ratio <= 1.10).

Measured (5 rounds, 2-core CPU at load ~5, 2026-12-03): compile 52.8 s vs 61.2 s, 1.01x; run
1.89 s vs 1.92 s, 0.89x; rerun 8.2 s vs 4.7 s, 1.01x (goal met in every row). With the reports
a Python callback, as before, the rerun row was 6.6x: jax keeps no program with a callback, so
a cell that a rerun would load in seconds was compiled again.

    python benchmarks/progress.py                 # 60 steps, every 20, 5 rounds
    python benchmarks/progress.py --quick         # a smoke test (the MLP task, 2 rounds)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import machine, median_interval, round_ratios  # noqa: E402

from fp4lab.sweep import compute  # noqa: E402
from fp4lab.train.config import Config  # noqa: E402

GOAL = 1.10
SEEDS = [(0, 0, 0), (1, 1, 1)]


def config(quick: bool, steps: int) -> Config:
    if quick:
        return Config(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,),
                      steps=steps, recipe="nvfp4", eval_batches=1, seed_batch=2)  # fmt: skip
    return Config(vocab=64, d_model=64, n_layers=2, scan_layers=True, n_heads=4, d_ff=128,
                  seq_len=32, batch_size=16, steps=steps, recipe="nvfp4", telemetry_every=25,
                  rules=((r"lm_head", "bf16"),), seed_batch=2)  # fmt: skip


def timed(cfg: Config, every: int) -> float:
    """Seconds of one compute_cell of the two seeds; with `every`, step reports every `every`
    steps to a sink that keeps the last event (as the progress display does, cheaply)."""
    last = {}
    t0 = time.perf_counter()
    if every:
        compute.compute_cell(cfg.to_dict(), SEEDS, progress=last.update, every=every)
    else:
        compute.compute_cell(cfg.to_dict(), SEEDS)
    return time.perf_counter() - t0


def rounds(call, every: int, n: int) -> dict[str, list[float]]:
    """{variant: seconds per round} of `call(0)` (none) and `call(every)` (reports), the two
    alternating which goes first."""
    out = {"none": [], "reports": []}
    order = ["none", "reports"]
    for _ in range(n):
        for name in order:
            out[name].append(call(every if name == "reports" else 0))
        order.reverse()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cache", help=argparse.SUPPRESS)  # a child: the caches' folder
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # ... and its `every`
    parser.add_argument("--row", help=argparse.SUPPRESS)  # ... and what it measures
    args = parser.parse_args()
    print(machine())  # the CPU, its vector extensions and the kernel clone
    if args.child is not None:  # one measurement in a process of its own: its seconds
        cfg = config(args.quick, args.steps)
        if args.row == "rerun":
            compute.use_compile_cache(args.cache, min_compile_seconds=0, programs=True)
        elif args.row == "run":
            timed(cfg, args.child)  # compiled: the next call is the run alone
        print(timed(cfg, args.child))
        return
    n = 2 if args.quick else args.rounds
    cfg = config(args.quick, args.steps)
    print(f"cell: {'MLP' if args.quick else 'LM d64 x2 scanned, telemetry 25'}, nvfp4, "
          f"{args.steps} steps, 2 seeds; reports every {args.every} steps; {n} rounds")  # fmt: skip
    rows = {}
    with tempfile.TemporaryDirectory() as folder:  # caches on disk, as a finished sweep's
        child = [sys.executable, __file__, "--steps", str(args.steps), "--cache", folder]
        child += ["--quick"] if args.quick else []
        for every in (0, args.every):  # a finished sweep's caches: each program traced once
            prefill = [*child, "--child", str(every), "--row", "rerun"]
            subprocess.run(prefill, check=True, capture_output=True)
        for row in ("compile", "run", "rerun"):

            def call(every: int, row=row) -> float:
                argv = [*child, "--child", str(every), "--row", row]
                out = subprocess.run(argv, capture_output=True, text=True)
                if out.returncode:
                    raise RuntimeError(out.stderr.strip().splitlines()[-1])
                return float(out.stdout.split()[-1])

            rows[row] = rounds(call, args.every, n)
    print(f"{'row':8} {'none s':>8} {'reports s':>10} {'ratio':>7}  95 % interval  goal <= {GOAL}")
    for name, t in rows.items():
        ratios = round_ratios(t["reports"], t["none"])
        ci = median_interval(ratios)
        shown = f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "(too few rounds)"
        print(
            f"{name:8} {statistics.median(t['none']):8.2f} {statistics.median(t['reports']):10.2f}"
            f" {statistics.median(ratios):7.2f}x  {shown}"
        )


if __name__ == "__main__":
    main()
