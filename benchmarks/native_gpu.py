"""Native block-scaled GEMMs against the simulator: parity and speed on a GPU.

For each native kind

  nvfp4  fl.nvfp4(convention="jax")        jax.nn.scaled_matmul, compute capability >= 10
  mxfp8  fl.mxfp8(scale_rounding="ceil")   jax.nn.scaled_matmul, compute capability >= 10
  fp8    fl.fp8("e4m3")                    FP8 dot_general (cuBLAS FP8), compute capability >= 8.9

and each size M = N = K (default 8192 and 4096), y = x . w with x (M, K), w (K, N) float32:

  parity   fp4lab.ops.native.native_fprop(x, w, dn, spec, spec) against the simulated
           fp4lab.qdot_general(x, w, dn, GemmRecipe(fprop_x=spec, fprop_w=spec)) with an
           FP32 (precision HIGHEST) GEMM: max |y_native - y_sim| / max |y_sim|, which should
           stay within FP32 accumulation order (1e-5): both multiply the same quantized operands
  time     native_fprop (quantize both operands + the native GEMM), the native GEMM alone on
           operands quantized beforehand, the simulated qdot_general (quantize-dequantize +
           float32 dot_general at default precision), and a bf16 lax.dot_general (float32
           output), all jitted; medians of interleaved rounds, each call ended with
           block_until_ready, after compilation and warm-up calls; speedups are the other
           method's time over native_fprop's (> 1: native is faster)

Kinds the device cannot run natively (fp4lab.ops.native.resolve says why) are listed as
skipped, as are kinds whose native call fails to compile here (e.g. a jax or cuDNN without
the kernel). On a CPU everything is skipped; `--cpu-check` instead checks the parity of the
rest of the native path (quantization, layout, outer scales) at small shapes, with
fp4lab.ops.native.reference_matmul standing in for the hardware GEMM.

    python benchmarks/native_gpu.py                    # on a Blackwell or Hopper GPU
    python benchmarks/native_gpu.py --sizes 4096 --reps 50
    python benchmarks/native_gpu.py --cpu-check        # anywhere
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys

import jax
import jax.numpy as jnp
from jax import lax
from timing import interleaved  # benchmarks/timing.py

import fp4lab as fl
from fp4lab.core.recipes import GemmRecipe
from fp4lab.ops import native as native_ops
from fp4lab.ops.dot_general import qdot_general
from fp4lab.ops.layout import DotLayout

TOL = 1e-5  # FP32 accumulation order, relative to max |y|
DN = (((1,), (0,)), ((), ()))  # x (M, K) . w (K, N)
KINDS = {
    "nvfp4": fl.nvfp4(convention="jax"),
    "mxfp8": fl.mxfp8(scale_rounding="ceil"),
    "fp8": fl.fp8("e4m3"),
}


def rel_err(y, ref) -> float:
    """max |y - ref| / max |ref| in float64 on the host."""
    y = jnp.asarray(y, jnp.float32)
    ref = jnp.asarray(ref, jnp.float32)
    scale = float(jnp.max(jnp.abs(ref)))
    return float(jnp.max(jnp.abs(y - ref))) / (scale if scale > 0 else 1.0)


def simulated(spec, dn, precision=None):
    recipe = GemmRecipe(fprop_x=spec, fprop_w=spec)
    return jax.jit(lambda x, w: qdot_general(x, w, dn, recipe, precision=precision))


def native(spec, dn, matmul=None):
    return jax.jit(lambda x, w: native_ops.native_fprop(x, w, dn, spec, spec, matmul=matmul))


def native_gemm_only(kind, spec, x, w, dn):
    """The native GEMM on operands quantized beforehand: (jitted fn, its arguments)."""
    lay = DotLayout.of(x.shape, w.shape, dn)
    a, sa, ga = native_ops.to_native(fl.quantize(lay.lhs_to(x), spec.replace(axis=-1)))
    b, sb, gb = native_ops.to_native(fl.quantize(lay.rhs_to(w), spec.replace(axis=-1)))
    if kind == "fp8":

        def f(a, b, sa, sb, g):
            dn3 = (((2,), (2,)), ((0,), (0,)))
            return lax.dot_general(a, b, dn3, preferred_element_type=jnp.float32) * g
    else:

        def f(a, b, sa, sb, g):
            return jax.nn.scaled_matmul(a, b, sa, sb, preferred_element_type=jnp.float32) * g

    return jax.jit(f), (a, b, sa, sb, ga * gb)


def bf16_dot(dn):
    return jax.jit(lambda a, b: lax.dot_general(a, b, dn, preferred_element_type=jnp.float32))


def median_ms(calls: dict, reps: int, warmup: int) -> dict[str, float]:
    """calls: {name: (jitted fn, args)}, compiled already."""
    for f, args in calls.values():
        for _ in range(warmup):
            jax.block_until_ready(f(*args))
    times = interleaved(
        {name: functools.partial(f, *args) for name, (f, args) in calls.items()}, reps
    )
    return {name: 1e3 * statistics.median(ts) for name, ts in times.items()}


def operands(m: int, k: int, n: int, seed: int = 0):
    kx, kw = jax.random.split(jax.random.key(seed))
    return jax.random.normal(kx, (m, k), jnp.float32), jax.random.normal(kw, (k, n), jnp.float32)


def supported(kinds, device) -> tuple[list[str], list[tuple[str, str]]]:
    """(kinds the device runs natively, [(kind, why skipped)])."""
    run, skipped = [], []
    for kind in kinds:
        spec = KINDS[kind]
        try:
            native_ops.resolve(spec, spec, "native", device)
        except RuntimeError as e:
            skipped.append((kind, str(e)))
        else:
            run.append(kind)
    return run, skipped


def print_skipped(skipped) -> None:
    for kind, why in skipped:
        print(f"skipped {kind}: {why}")


def cpu_check(kinds) -> bool:
    """Parity of the native path with reference_matmul at small shapes; True if all pass."""
    shapes = [
        ("(128, 512) . (512, 256)", (128, 512), (512, 256), DN),
        ("(2, 32, 256) . (256, 64)", (2, 32, 256), (256, 64), (((2,), (0,)), ((), ()))),
        ("(256, 1024) . (96, 1024)^T", (256, 1024), (96, 1024), (((1,), (1,)), ((), ()))),
    ]
    print("| kind | x . w | max abs err / max abs y | tolerance | parity |")
    print("|---|---|---:|---:|---|")
    ok_all = True
    for kind in kinds:
        spec = KINDS[kind]
        for i, (label, xs, ws, dn) in enumerate(shapes):
            kx, kw = jax.random.split(jax.random.key(i))
            x = jax.random.normal(kx, xs, jnp.float32)
            w = jax.random.normal(kw, ws, jnp.float32)
            y_nat = native(spec, dn, matmul=native_ops.reference_matmul)(x, w)
            y_sim = simulated(spec, dn, precision=lax.Precision.HIGHEST)(x, w)
            if y_nat.shape != y_sim.shape:
                raise AssertionError(f"{kind} {label}: shapes {y_nat.shape} != {y_sim.shape}")
            err = rel_err(y_nat, y_sim)
            ok = err <= TOL
            ok_all &= ok
            print(f"| {kind} | {label} | {err:.2e} | {TOL:.0e} | {'ok' if ok else 'FAILED'} |")
    return ok_all


def gpu_bench(kinds, sizes, reps: int, warmup: int) -> bool:
    cols = [
        "kind",
        "M=N=K",
        "max abs err / max abs y",
        "parity",
        "native ms",
        "native GEMM only ms",
        "simulated ms",
        "bf16 ms",
        "speedup vs bf16",
        "speedup vs simulated",
    ]
    rows, failed, ok_all = [], [], True
    for kind in kinds:
        spec = KINDS[kind]
        for size in sizes:
            x, w = operands(size, size, size)
            try:
                f_nat = native(spec, DN)
                y_nat = jax.block_until_ready(f_nat(x, w))
                f_gemm, gemm_args = native_gemm_only(kind, spec, x, w, DN)
                jax.block_until_ready(f_gemm(*gemm_args))
            except Exception as e:  # a missing kernel shows up in many forms
                failed.append((kind, size, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"))
                continue
            y_ref = simulated(spec, DN, precision=lax.Precision.HIGHEST)(x, w)
            err = rel_err(y_nat, y_ref)
            ok = err <= TOL
            ok_all &= ok
            del y_ref, y_nat
            f_sim = simulated(spec, DN)
            f_bf = bf16_dot(DN)
            xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
            jax.block_until_ready(f_sim(x, w))
            jax.block_until_ready(f_bf(xb, wb))
            ms = median_ms(
                {
                    "native": (f_nat, (x, w)),
                    "gemm": (f_gemm, gemm_args),
                    "sim": (f_sim, (x, w)),
                    "bf16": (f_bf, (xb, wb)),
                },
                reps,
                warmup,
            )
            rows.append(
                [
                    kind,
                    str(size),
                    f"{err:.2e}",
                    "ok" if ok else "FAILED",
                    f"{ms['native']:.3f}",
                    f"{ms['gemm']:.3f}",
                    f"{ms['sim']:.3f}",
                    f"{ms['bf16']:.3f}",
                    f"{ms['bf16'] / ms['native']:.2f}x",
                    f"{ms['sim'] / ms['native']:.2f}x",
                ]
            )
    if rows:
        print("| " + " | ".join(cols) + " |")
        print("|" + "|".join(["---", "---:", "---:", "---"] + ["---:"] * (len(cols) - 4)) + "|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
    for kind, size, why in failed:
        print(f"skipped {kind} at {size}: the native call failed here ({why})")
    return ok_all


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="8192,4096", help="comma-separated M = N = K")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated native kinds")
    p.add_argument("--reps", type=int, default=20, help="timed calls per method")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls after compiling")
    p.add_argument(
        "--cpu-check",
        action="store_true",
        help="parity of the native path with a reference matmul at small shapes (any device)",
    )
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        p.error(f"unknown kinds {bad}; known: {', '.join(KINDS)}")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if any(s % 32 for s in sizes):
        p.error("--sizes must be multiples of 32 (MXFP8 blocks)")

    dev = native_ops.current_device()
    print(
        f"device: {dev.platform} {dev.name} (compute capability {dev.compute_capability}), "
        f"jax {jax.__version__}"
    )
    if args.cpu_check:
        print("cpu-check: native path with fp4lab.ops.native.reference_matmul as the GEMM")
        print()
        ok = cpu_check(kinds)
        print()
        print(f"parity within {TOL:.0e}: {'all ok' if ok else 'FAILED'}")
        return 0 if ok else 1

    run, skipped = supported(kinds, dev)
    print(f"sizes M=N=K {sizes}; median of {args.reps} calls after {args.warmup} warm-up calls")
    print()
    print_skipped(skipped)
    if not run:
        print("no native kind runs on this device: nothing to time (try --cpu-check)")
        return 0
    ok = gpu_bench(run, sizes, args.reps, args.warmup)
    print()
    print(f"parity within {TOL:.0e}: {'all ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
