"""Speed of fp4lab's fake quantizers against a memory-bound floor and other libraries.

Times jitted `fl.fake_quant` (quantize + dequantize) on an N x N float32 array on the default
backend and prints a markdown table of median times and ratios to:

  x * 2      a jitted elementwise multiply: one read and one write of the array, the floor
  jax nvfp4  jax's own NVFP4 quantizer (jax._src.cudnn.scaled_matmul_stablehlo.quantize, with
             a tensor scale g = amax / (6 * 448)) followed by a blockwise dequantization
  qwix nvfp4 qwix.quantize(x, "nvfp4", tiled_axes={1: 16}) + qwix.dequantize, when qwix is
             installed (the `bench` extra: `pip install -e ".[bench]"`; qwix's NVFP4 has E4M3
             block scales but no second-level tensor scale)

and fp4lab's nvfp4 1x16 once more in each clone of the CPU kernel this CPU runs (`clone`
rows: FP4LAB_CPU_CLONE forced while tracing; "avx2" on an AVX-512 CPU is the AVX2 code, not
an AVX2 CPU's memory system) and as the jnp reference (FP4LAB_QUANTIZER=reference).

All methods run in one process and are timed in interleaved rounds (every method once per
round, in a shuffled order), each call ended with block_until_ready, after compilation and
warm-up calls. The goal (nvfp4 1x16 at most 1.3x the copy, at least 1.5x faster than qwix) is
judged on the per-round ratios: their median, and the sign test's 95 % interval of it
(`benchmarks/timing.py`), which says when the rounds cannot tell. The header names the CPU,
its vector extensions and the kernel's clone (`timing.machine`).

    python benchmarks/quantizer.py --size 4096 --reps 61

Each round takes about half a second on two cores; 61 rounds (the default) give an interval
narrow enough to decide the goal on this machine, where 20 to 31 rounds often did not.
"""

from __future__ import annotations

import argparse
import functools
import statistics

import jax
import jax.numpy as jnp
from jax._src.cudnn.scaled_matmul_stablehlo import BlockScaleConfig
from jax._src.cudnn.scaled_matmul_stablehlo import quantize as jax_quantize
from timing import goal_verdict, interleaved, machine, round_ratios  # benchmarks/timing.py
from user_model import forced  # benchmarks/user_model.py

import fp4lab as fl
from fp4lab.core import cpu_kernels

GOAL_COPY = 1.3  # nvfp4 1x16 at most this many times the x * 2 floor
GOAL_QWIX = 1.5  # and at least this many times faster than qwix


def copy_floor(x):
    return x * 2


def jax_nvfp4(x):
    """jax's NVFP4 quantize (tensor scale from amax, in the jitted function) + dequantize."""
    g = jnp.max(jnp.abs(x)).astype(jnp.float32) / jnp.float32(6.0 * 448.0)
    cfg = BlockScaleConfig(
        mode="nvfp4",
        block_size=16,
        data_type=jnp.float4_e2m1fn,
        scale_type=jnp.float8_e4m3fn,
        global_scale=g,
        infer_only=False,
    )
    x_q, scale = jax_quantize(x, cfg)
    xb = x_q.astype(jnp.float32).reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
    return (xb * scale.astype(jnp.float32)[..., None] * g).reshape(x.shape)


def qwix_nvfp4(qwix):
    def f(x):
        q = qwix.quantize(x, "nvfp4", tiled_axes={x.ndim - 1: 16})
        return qwix.dequantize(q).astype(x.dtype)

    return f


def fake_quant(spec):
    def f(x):
        return fl.fake_quant(x, spec)

    return f


def timed(fns: dict, x, reps: int, warmup: int, env: dict) -> dict[str, list[float]]:
    """Seconds of each round per method, compiled and warmed up first (`timing.interleaved`);
    env[name], where given, holds environment variables set while that method traces."""
    jitted = {name: jax.jit(f) for name, f in fns.items()}
    for name, f in jitted.items():  # compile (tracing under the row's variables), warm up
        with forced(**env.get(name, {})):
            f(x).block_until_ready()
        for _ in range(warmup):
            f(x).block_until_ready()
    return interleaved({name: functools.partial(f, x) for name, f in jitted.items()}, reps)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=4096, help="N of the N x N float32 input")
    p.add_argument("--reps", type=int, default=61, help="timed rounds (every method once each)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls after compiling")
    args = p.parse_args(argv)
    if args.size % 32:
        p.error("--size must be a multiple of 32 (MXFP4 blocks)")

    try:
        import qwix
    except ImportError:
        qwix = None

    x = jax.random.normal(jax.random.key(0), (args.size, args.size), jnp.float32)
    fps = {
        "fp4lab nvfp4 1x16": fake_quant(fl.nvfp4()),
        "fp4lab nvfp4 16x16": fake_quant(fl.nvfp4(tile=(16, 16))),
        "fp4lab nvfp4 four-over-six (mae)": fake_quant(fl.nvfp4(four_over_six="mae")),
        "fp4lab mxfp4": fake_quant(fl.mxfp4()),
    }
    env = {}  # the rows of one clone, and of the jnp reference
    for clone in cpu_kernels.clones():
        fps[f"fp4lab nvfp4 1x16, clone {clone}"] = fake_quant(fl.nvfp4())
        env[f"fp4lab nvfp4 1x16, clone {clone}"] = {"FP4LAB_CPU_CLONE": clone}
    fps["fp4lab nvfp4 1x16, jnp reference"] = fake_quant(fl.nvfp4())
    env["fp4lab nvfp4 1x16, jnp reference"] = {"FP4LAB_QUANTIZER": "reference"}
    refs = {"x * 2 (copy floor)": copy_floor, "jax nvfp4": jax_nvfp4}
    if qwix is not None:
        refs["qwix nvfp4"] = qwix_nvfp4(qwix)
    times = timed({**refs, **fps}, x, args.reps, args.warmup, env)
    ms = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}

    dev = jax.devices()[0]
    print(machine())
    print(
        f"fake_quant, {args.size}x{args.size} float32 on {dev.platform} ({dev.device_kind}), "
        f"jax {jax.__version__}; median of {args.reps} reps after {args.warmup} warm-up calls"
    )
    if qwix is None:
        print("qwix is not installed: the qwix column is skipped")
    print()
    cols = ["method", "median ms", "ratio to x*2", "ratio to jax nvfp4"]
    if qwix is not None:
        cols.append("ratio to qwix")
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join(["---"] + ["---:"] * (len(cols) - 1)) + "|")
    for name, t in ms.items():
        row = [name, f"{t:.2f}", f"{t / ms['x * 2 (copy floor)']:.2f}x"]
        row.append(f"{t / ms['jax nvfp4']:.2f}x")
        if qwix is not None:
            row.append(f"{t / ms['qwix nvfp4']:.2f}x")
        print("| " + " | ".join(row) + " |")

    ours = times["fp4lab nvfp4 1x16"]
    vs_copy = round_ratios(ours, times["x * 2 (copy floor)"])
    print()
    for clone in cpu_kernels.clones():
        row = round_ratios(times[f"fp4lab nvfp4 1x16, clone {clone}"], times["x * 2 (copy floor)"])
        print(f"clone {clone}: {statistics.median(row):.2f}x the copy")
    ref = round_ratios(ours, times["fp4lab nvfp4 1x16, jnp reference"])
    print(f"the kernel: {statistics.median(ref):.2f}x the jnp reference's time")
    print(f"goal: nvfp4 1x16 <= {GOAL_COPY}x the copy and >= {GOAL_QWIX}x faster than qwix")
    print("  (per-round ratios: their median, and the sign test's interval of it)")
    copy = goal_verdict(vs_copy, GOAL_COPY)
    print(f"  copy: {statistics.median(vs_copy):.2f}x the copy -> {copy}")
    parts = [copy]
    if qwix is None:
        print("  qwix: not installed -> not measured")
    else:
        speedup = round_ratios(times["qwix nvfp4"], ours)
        faster = goal_verdict(speedup, GOAL_QWIX, at_least=True)
        print(f"  qwix: {statistics.median(speedup):.2f}x faster than qwix -> {faster}")
        parts.append(faster)
    if any(p.startswith("NOT met") for p in parts):
        verdict = "NOT met"
    elif qwix is None:
        verdict = "not decided (the qwix part is not measured)"
    elif all(p.startswith("met") for p in parts):
        verdict = "met"
    else:
        verdict = "not decided by these rounds"
    print(f"goal {verdict}")


if __name__ == "__main__":
    main()
