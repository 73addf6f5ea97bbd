"""Seeds batched with jax.vmap against the same seeds one after another, in one process.

One small cell of a sweep (`--cell mlp`: teacher-student regression with an MLP; `--cell lm`:
the Llama-style LM on the Markov language), `--steps` optimizer steps, is run for 8 seeds, all
through the sweep's own `compute_cell`:

  vmapped      pad_seeds=True, seed_batch=8: one compiled call trains all 8 seeds in a batch
  sequential   pad_seeds=True, seed_batch=1: the same compiled single-seed call, 8 times
  vmapped x4   pad_seeds=True, seed_batch=4 (and x2): two (four) calls of a 4-wide (2-wide)
               program, to show which vmap width uses the CPU best
  mapped       the default (pad_seeds=False), seed_batch=8: one call runs the 8 seeds one after
               the other (lax.map), each seed's bits those of the seed alone
  mapped x4    the default, seed_batch=4 (the default): two such calls

and for 1 seed, the run a researcher starts first: `1 seed padded` (pad_seeds=True: the call
is seed_batch=4 wide, padded with copies) against `1 seed` (the default: one seed computed).

All are compiled first (the first call's seconds reported separately) and called once more;
then they are timed in interleaved rounds, and the table gives the median seconds per round and
seeds per second.
Goal: vmapped throughput >= 4x sequential. On a CPU, vmap pays off where each seed's work is
too small to fill the cores (per-op overhead dominates); an LM whose matmuls already fill them
gains little, which `--cell lm` shows.

    python benchmarks/sweep.py                 # mlp cell, recipe bf16, 100 steps, 5 rounds
    python benchmarks/sweep.py --cell lm
    python benchmarks/sweep.py --recipe nvfp4 --rounds 3
    python benchmarks/sweep.py --quick         # a smoke test
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from timing import machine  # noqa: E402  (benchmarks/timing.py)

from fp4lab import sweep  # noqa: E402
from fp4lab.train.config import Config  # noqa: E402

GOAL = 4.0
SEEDS = [(i, i, i) for i in range(8)]
CELLS = {
    "mlp": "teacher-student MLP 32-64-64-32, batch 32",
    "lm": "Llama-style LM d_model 64, 2 layers, seq 32, batch 16, Markov language",
}
MLP = dict(task="teacher", din=32, dout=32, teacher_hidden=(64,), hidden=(64, 64), batch_size=32)
LM = dict(vocab=64, d_model=64, n_heads=4, n_layers=2, d_ff=128, seq_len=32, batch_size=16)


def compile_seconds(cfg: Config, n: int) -> float:
    """Seconds of the first compute_cell call on `n` seeds (trace + compile + the call)."""
    sweep.clear_cache(cfg)
    return timed_run(cfg, n)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="bf16")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cell", choices=("mlp", "lm"), default="mlp")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    print(machine())  # the CPU, its vector extensions and the kernel clone
    steps, rounds = (10, 2) if args.quick else (args.steps, args.rounds)
    if args.cell == "lm":
        base = Config(recipe=args.recipe, steps=steps, eval_batches=2, **LM)
    else:
        base = Config(recipe=args.recipe, steps=steps, eval_batches=2, **MLP)
    padded = base.replace(pad_seeds=True)
    cells = {
        "vmapped": padded.replace(seed_batch=8),
        "sequential": padded.replace(seed_batch=1),
        "vmapped x4": padded.replace(seed_batch=4),
        "vmapped x2": padded.replace(seed_batch=2),
        "mapped": base.replace(seed_batch=8),
        "mapped x4": base.replace(seed_batch=4),
    }
    ones = {"1 seed padded": padded.replace(seed_batch=4), "1 seed": base.replace(seed_batch=4)}
    first = {name: compile_seconds(cfg, len(SEEDS)) for name, cfg in cells.items()}
    first |= {name: compile_seconds(cfg, 1) for name, cfg in ones.items()}
    # rows share configs ("1 seed" is "mapped x4"'s), and a first-call measurement clears its
    # config's programs of every width: call every row once more, untimed, so no round compiles
    for cfg in cells.values():
        timed_run(cfg, len(SEEDS))
    for cfg in ones.values():
        timed_run(cfg, 1)
    times = {name: [] for name in (*cells, *ones)}
    for _ in range(rounds):
        for name, cfg in cells.items():
            times[name].append(timed_run(cfg, len(SEEDS)))
        for name, cfg in ones.items():
            times[name].append(timed_run(cfg, 1))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(
        f"8 seeds of one cell: {args.recipe}, {CELLS[args.cell]}, {steps} steps; "
        f"median of {rounds} interleaved rounds"
    )
    print(f"{'':14s} {'first call s':>12s} {'median s':>10s} {'seeds/s':>9s}")
    for name in times:
        n = len(SEEDS) if name in cells else 1
        print(f"{name:14s} {first[name]:12.1f} {med[name]:10.3f} {n / med[name]:9.2f}")
    ratio = med["sequential"] / med["vmapped"]
    verdict = "met" if ratio >= GOAL else "NOT met"
    print(f"vmapped throughput: {ratio:.2f}x sequential (goal >= {GOAL:.0f}x): {verdict}")
    for width in ("vmapped x4", "vmapped x2", "mapped", "mapped x4"):
        print(f"{width} throughput: {med['sequential'] / med[width]:.2f}x sequential")
    print(
        f"mapped x4 (the default) against vmapped x4 (pad_seeds=True): "
        f"{med['mapped x4'] / med['vmapped x4']:.2f}x the time"
    )
    print(
        f"1 seed: padded to 4 takes {med['1 seed padded'] / med['1 seed']:.2f}x the time of the "
        "default's one seed"
    )


def timed_run(cfg: Config, n: int) -> float:
    t0 = time.perf_counter()
    sweep.compute_cell(cfg.to_dict(), SEEDS[:n])
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
