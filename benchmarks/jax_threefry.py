"""jax.random's Threefry hash lowered to fp4lab's CPU kernel, against jax's own lowering.

`fp4lab.core.cpu_kernels.lower_jax_threefry()` makes jax's Threefry primitive one kernel call
where jax compiles a while loop of five iterations, for the rest of a process. A sweep cell's
program holds many of them (flax's initializers, the task's data sampler, the seed streams'
keys). Each row is a fresh process (the lowering is process-wide) that runs one cell through
`fp4lab.sweep.compute_cell` (2 seeds, `--steps` steps, nvfp4), twice: the first call, with the
cell's compile seconds as `compute_cell` reports them (trace, lower and compile of its program),
then the second call (the program cached, the run alone). The processes alternate between the
two lowerings, round by round; the table gives the medians and the ratio kernel / jax per round.

    python benchmarks/jax_threefry.py                  # lm and mlp cells, 3 rounds
    python benchmarks/jax_threefry.py --cell lm --rounds 5
    XLA_FLAGS=--xla_backend_optimization_level=0 python benchmarks/jax_threefry.py  # as the tests
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from timing import machine  # noqa: E402  (benchmarks/timing.py)

CELLS = {
    "lm": dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, seq_len=16, batch_size=8, vocab=32),
    "mlp": dict(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,)),
}
LOWERINGS = ("jax", "kernel")
CHILD = "--child"  # the argument that makes a process measure one row


def child(cell: str, lowering: str, steps: int) -> dict:
    """One row, measured in this process: the cell's compile seconds as `compute_cell` reports
    them (`compile_s`: trace, lower and compile of the cell's program), its first call and its
    second."""
    from fp4lab import sweep
    from fp4lab.core import cpu_kernels
    from fp4lab.train.config import Config

    if lowering == "kernel" and not cpu_kernels.lower_jax_threefry():
        raise SystemExit(f"no CPU kernels here: {cpu_kernels.build_error()}")
    batch = 8 if cell == "lm" else 32
    config = Config(**(CELLS[cell] | dict(recipe="nvfp4", steps=steps, batch_size=batch)))
    seeds = [(0, 0, 0), (1, 1, 1)]
    t = time.perf_counter()
    first = sweep.compute_cell(config.to_dict(), seeds)
    first_s = time.perf_counter() - t
    t = time.perf_counter()
    sweep.compute_cell(config.to_dict(), seeds)
    return dict(
        compile=first[0]["summary"]["compile_s"], first=first_s, second=time.perf_counter() - t
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", choices=[*CELLS, "both"], default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    print(machine())
    print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    print("| cell | lowering | compile s | first call s | second call s | compile kernel/jax |")
    print("|---|---|---:|---:|---:|---:|")
    for cell in CELLS if args.cell == "both" else [args.cell]:
        rows = {lowering: [] for lowering in LOWERINGS}
        for r in range(args.rounds):
            for lowering in LOWERINGS if r % 2 == 0 else LOWERINGS[::-1]:
                command = [sys.executable, __file__, CHILD, cell, lowering, str(args.steps)]
                out = subprocess.run(command, capture_output=True, text=True)
                if out.returncode:
                    raise SystemExit(out.stderr)
                rows[lowering].append(json.loads(out.stdout.splitlines()[-1]))
        ratios = [
            k["compile"] / j["compile"] for j, k in zip(rows["jax"], rows["kernel"], strict=True)
        ]
        for lowering in LOWERINGS:
            median = {m: statistics.median(r[m] for r in rows[lowering]) for m in rows[lowering][0]}
            ratio = f"{statistics.median(ratios):.2f}" if lowering == "kernel" else ""
            print(
                f"| {cell} | {lowering} | {median['compile']:.2f} | {median['first']:.2f} "
                f"| {median['second']:.3f} | {ratio} |"
            )


if __name__ == "__main__":
    if sys.argv[1:2] == [CHILD]:  # one row, in a fresh process (the lowering is process-wide)
        cell, lowering, steps = sys.argv[2:5]
        print(json.dumps(child(cell, lowering, int(steps))))
    else:
        main()
