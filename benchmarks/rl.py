"""PPO on CartPole: seeds vmapped vs sequential, and NVFP4 vs FP32, side by side.

One call runs `updates` PPO updates (4 envs x 128 steps each, 4 epochs of 4 minibatches, the
purejaxrl CartPole settings of fp4lab.rl.ppo) from fresh parameters, for

  fp32 x1               one seed, jax.jit(train)(key)
  fp32 x8 vmapped       8 seeds in one program, jax.jit(jax.vmap(train))(keys)
  fp32 x8 sequential    the same 8 seeds one after the other through the x1 program
  fp32 x8 vmapped exact the vmapped program compiled with fp4lab.rl.EXACT_CPU (bit-exact seeds)
  nvfp4 x1, nvfp4 x8 vmapped, nvfp4-rl x8 vmapped
                        every GEMM of actor and critic under the recipe (simulated backend;
                        the 4-wide input and 2-wide output are zero-padded to 16-blocks)

All rows live in one process. Each program is compiled and warmed up first (compile time is
reported), then timed in interleaved rounds (every row once per round, in a shuffled order), each
call ended with block_until_ready; the table gives medians and the fastest call (less sensitive to
other processes on a shared machine). Ratios are of medians.

    python benchmarks/rl.py            # 10 updates per call, 5 rounds
    python benchmarks/rl.py --quick    # 2 updates per call, 2 rounds (a smoke test)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
from timing import interleaved, machine  # benchmarks/timing.py

from fp4lab.rl import EXACT_CPU, PPOConfig, ppo

SEEDS = 8


def build(updates: int) -> dict:
    """{row: (call, n_seeds, first-call seconds)}; call() runs one timed unit of work."""
    keys = jax.random.split(jax.random.key(0), SEEDS)
    rows = {}

    def add(name, fn, args, seeds, sequential=False):
        t0 = time.perf_counter()
        compiled = fn.lower(*args).compile()
        if sequential:

            def call():
                return [compiled(k) for k in keys]
        else:

            def call():
                return compiled(*args)

        jax.block_until_ready(call())
        rows[name] = (call, seeds, time.perf_counter() - t0)
        print(f"  compiled {name}: {rows[name][2]:.1f} s", flush=True)

    for recipe in ("fp32", "nvfp4", "nvfp4-rl"):
        cfg = PPOConfig(recipe=recipe, total_steps=updates * 4 * 128)
        train = ppo.make_train(cfg)
        if recipe != "nvfp4-rl":
            add(f"{recipe} x1", jax.jit(train), (keys[0],), 1)
        add(f"{recipe} x8 vmapped", jax.jit(jax.vmap(train)), (keys,), SEEDS)
        if recipe == "fp32":
            add("fp32 x8 sequential", jax.jit(train), (keys[0],), SEEDS, sequential=True)
            exact = jax.jit(jax.vmap(train), compiler_options=EXACT_CPU)
            add("fp32 x8 vmapped exact", exact, (keys,), SEEDS)
    return rows


def measure(rows: dict, reps: int) -> tuple[dict, dict]:
    """(median seconds per call, fastest seconds per call) per row."""
    times = interleaved({name: row[0] for name, row in rows.items()}, reps)
    return (
        {n: statistics.median(ts) for n, ts in times.items()},
        {n: min(ts) for n, ts in times.items()},
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--updates", type=int, default=10, help="PPO updates per timed call")
    p.add_argument("--reps", type=int, default=5, help="timed rounds")
    p.add_argument("--quick", action="store_true", help="2 updates, 2 rounds (a smoke test)")
    args = p.parse_args(argv)
    print(machine())  # the CPU, its vector extensions and the kernel clone
    updates, reps = (2, 2) if args.quick else (args.updates, args.reps)

    rows = build(updates)
    med, best = measure(rows, reps)

    dev = jax.devices()[0]
    steps = updates * 4 * 128  # environment steps per seed and call
    print()
    print(
        f"PPO CartPole-v1, {updates} updates x 512 env steps per seed and call, "
        f"{dev.platform} ({dev.device_kind}), {os.cpu_count()} CPUs, jax {jax.__version__}; "
        f"median of {reps} rounds"
    )
    if hasattr(os, "getloadavg"):
        load = os.getloadavg()
        print(f"load average at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}")
    print()
    print(
        "| row | median s/call | ms/update | env steps/s (all seeds) | fastest s/call | compile s |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, (_, seeds, first) in rows.items():
        t = med[name]
        print(
            f"| {name} | {t:.3f} | {1e3 * t / updates:.1f} | {seeds * steps / t:,.0f} "
            f"| {best[name]:.3f} | {first:.1f} |"
        )
    print()
    r = med
    print(f"8 seeds: sequential / vmapped = {r['fp32 x8 sequential'] / r['fp32 x8 vmapped']:.2f}x")
    print(f"8 seeds vmapped / 1 seed (fp32) = {r['fp32 x8 vmapped'] / r['fp32 x1']:.2f}x")
    exact = r["fp32 x8 vmapped exact"] / r["fp32 x8 vmapped"]
    print(f"EXACT_CPU / default (fp32, 8 vmapped) = {exact:.2f}x")
    print(f"nvfp4 / fp32, 1 seed = {r['nvfp4 x1'] / r['fp32 x1']:.2f}x")
    print(f"nvfp4 / fp32, 8 seeds vmapped = {r['nvfp4 x8 vmapped'] / r['fp32 x8 vmapped']:.2f}x")
    print(
        f"nvfp4-rl / fp32, 8 seeds vmapped = {r['nvfp4-rl x8 vmapped'] / r['fp32 x8 vmapped']:.2f}x"
    )


if __name__ == "__main__":
    main()
