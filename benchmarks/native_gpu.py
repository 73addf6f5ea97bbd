"""Native FP4/FP8 GEMMs against the simulator: parity of all three GEMMs, and a training step.

One script, one table: a row for each native kind the device runs:

  nvfp4  fl.nvfp4(convention="jax") on all six operands    jax.nn.scaled_matmul, cc >= 10
  mxfp8  fl.mxfp8(scale_rounding="ceil") on all six         jax.nn.scaled_matmul, cc >= 10
  fp8    E4M3 forward operands, E5M2 gradients (per tensor)  FP8 dot_general, cc >= 8.9

  parity   y (Fprop), dx (Dgrad) and dw (Wgrad) of a dot_general with every GEMM native
           against the simulator with FP32 GEMMs at precision HIGHEST, on the same quantized
           operands: max |native - simulated| / max |simulated| per GEMM, which should stay
           within FP32 accumulation order (1e-5)
  step     one training step (forward, backward, Adam; nnx.jit) of the 4-block Llama-style LM
           (d=512, 8 heads, d_ff=2048, sequence 256, batch 16; lm_head in high precision) under
           the kind's recipe simulated and native, and under bf16: the first call (compile) in
           seconds, then the median of interleaved timed steps in ms

Kinds the device cannot run natively (fp4lab.ops.native.gemm_backends says why) are listed as
skipped, as are kinds whose native call fails here (e.g. a jax or cuDNN without the kernel).
On Hopper, FP8 runs and NVFP4/MXFP8 are skipped. `--cpu-check` (any device, run by the tests)
checks the parity part at small shapes with fp4lab.ops.native.reference_matmul standing in for
the hardware GEMM, and skips the step timing. Planned to finish in well under 8 minutes on one
GPU.

    python benchmarks/native_gpu.py                    # on a Blackwell or Hopper GPU
    python benchmarks/native_gpu.py --reps 50
    python benchmarks/native_gpu.py --cpu-check        # anywhere
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax import lax
from timing import interleaved, machine  # benchmarks/timing.py

import fp4lab as fl
from fp4lab import schema
from fp4lab.core.recipes import GemmRecipe
from fp4lab.models.transformer import Transformer, TransformerConfig
from fp4lab.ops import custom_vjp
from fp4lab.ops import native as native_ops
from fp4lab.ops.dot_general import DotGemm

TOL = 1e-5  # FP32 accumulation order, relative to max |y|


def _all_six(spec, name: str) -> GemmRecipe:
    return GemmRecipe(**dict.fromkeys(schema.OPERAND_NAMES, spec), name=name)


E4, E5 = fl.fp8("e4m3"), fl.fp8("e5m2")
KINDS = {
    "nvfp4": _all_six(fl.nvfp4(convention="jax"), "nvfp4-native"),
    "mxfp8": _all_six(fl.mxfp8(scale_rounding="ceil"), "mxfp8-native"),
    "fp8": GemmRecipe(
        fprop_x=E4, fprop_w=E4, dgrad_dy=E5, dgrad_w=E4, wgrad_x=E4, wgrad_dy=E5, name="fp8"
    ),
}
SHAPES = [  # (label, x shape, w shape, dimension numbers)
    ("(B, T, D) . (D, F)", (4, 256, 512), (512, 384), (((2,), (0,)), ((), ()))),
    ("(T, D) . (F, D)^T", (512, 1024), (256, 1024), (((1,), (1,)), ((), ()))),
]
SMALL = [  # --cpu-check
    ("(B, T, D) . (D, F)", (2, 32, 128), (128, 64), (((2,), (0,)), ((), ()))),
    ("(T, D) . (F, D)^T", (64, 256), (96, 256), (((1,), (1,)), ((), ()))),
]


def rel_err(y, ref) -> float:
    """max |y - ref| / max |ref|."""
    y, ref = jnp.asarray(y, jnp.float32), jnp.asarray(ref, jnp.float32)
    scale = float(jnp.max(jnp.abs(ref)))
    return float(jnp.max(jnp.abs(y - ref))) / (scale if scale > 0 else 1.0)


def gemms(recipe, dn, backends, matmul=None, precision=None):
    """jit (x, w, g) -> (y, (dx, dw)) of one quantized dot_general under the cotangent g.

    g is fixed (not computed from y): a cotangent that depended on y would feed the Fprop's
    last-bit differences into the quantized dy of Dgrad and Wgrad and flip rounding there.
    """
    gemm = DotGemm(
        recipe=recipe, dimension_numbers=dn, backends=backends, matmul=matmul, precision=precision
    )

    def run(x, w, g):
        y, vjp = jax.vjp(
            lambda a, b: custom_vjp.apply(gemm, a, b, (jax.random.key(0), {}, None)), x, w
        )
        return y, vjp(g)

    return jax.jit(run)


def parity(kind, shapes, matmul=None) -> tuple[list[float] | None, str]:
    """Max relative error of Fprop y, Dgrad dx and Wgrad dw over `shapes`, or (None, why)."""
    recipe, worst = KINDS[kind], [0.0, 0.0, 0.0]
    for i, (_, xs, ws, dn) in enumerate(shapes):
        kx, kw, kg = jax.random.split(jax.random.key(i), 3)
        x = jax.random.normal(kx, xs, jnp.float32)
        w = jax.random.normal(kw, ws, jnp.float32)
        y = jax.eval_shape(functools.partial(lax.dot_general, dimension_numbers=dn), x, w)
        g = jax.random.normal(kg, y.shape)
        try:
            y_n, (dx_n, dw_n) = gemms(recipe, dn, ("native",) * 3, matmul)(x, w, g)
        except Exception as e:  # a missing kernel shows up in many forms
            return None, f"native call failed: {_first(e)}"
        hi = lax.Precision.HIGHEST
        y_s, (dx_s, dw_s) = gemms(recipe, dn, ("simulated",) * 3, precision=hi)(x, w, g)
        errs = [rel_err(y_n, y_s), rel_err(dx_n, dx_s), rel_err(dw_n, dw_s)]
        worst = [max(a, b) for a, b in zip(worst, errs, strict=True)]
    return worst, "ok" if max(worst) <= TOL else "FAILED"


def _first(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}" if str(e) else type(e).__name__


LM = TransformerConfig(vocab=256, d_model=512, n_layers=4, n_heads=8, d_ff=2048, max_len=256)


def _loss(model, tokens):
    logits = model(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def _step(model, opt, tokens):
    loss, grads = nnx.value_and_grad(_loss)(model, tokens)
    opt.update(model, grads)
    return loss


def lm_step(kind, reps: int, warmup: int) -> dict[str, tuple[float, float]]:
    """{"simulated" | "native" | "bf16": (compile s, median ms per step)} of the 4-block LM."""
    tokens = jax.random.randint(jax.random.key(0), (16, LM.max_len + 1), 0, LM.vocab)
    rows = {}
    for name, recipe, backend in (
        ("simulated", KINDS[kind], "simulated"),
        ("native", KINDS[kind], "native"),
        ("bf16", "bf16", "simulated"),
    ):
        model = Transformer(LM, rngs=nnx.Rngs(0))
        rules = [fl.Rule(r".*lm_head.*", None), fl.Rule(r".*", recipe)]
        fl.quantize_model(model, rules, backend=backend)
        opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
        step = nnx.jit(_step)
        t0 = time.perf_counter()
        jax.block_until_ready(step(model, opt, tokens))
        rows[name] = (functools.partial(step, model, opt, tokens), time.perf_counter() - t0)
    for fn, _ in rows.values():
        for _ in range(warmup):
            jax.block_until_ready(fn())
    calls = {n: (lambda f=f: jax.block_until_ready(f())) for n, (f, _) in rows.items()}
    times = interleaved(calls, reps)
    return {n: (first, 1e3 * statistics.median(times[n])) for n, (_, first) in rows.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated native kinds")
    p.add_argument("--reps", type=int, default=20, help="timed training steps per row")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps after compiling")
    p.add_argument(
        "--cpu-check",
        action="store_true",
        help="parity of all three GEMMs with a reference matmul at small shapes (any device)",
    )
    args = p.parse_args(argv)
    print(machine())  # the CPU, its vector extensions and the kernel clone
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        p.error(f"unknown kinds {bad}; known: {', '.join(KINDS)}")
    dev = native_ops.current_device()
    print(
        f"device: {dev.platform} {dev.name} (compute capability {dev.compute_capability}), "
        f"jax {jax.__version__}"
    )
    if args.cpu_check:
        print("cpu-check: the native path with fp4lab.ops.native.reference_matmul as the GEMM;")
        print("the training step is not timed here")
        run, shapes, matmul = kinds, SMALL, native_ops.reference_matmul
    else:
        run, shapes, matmul = [], SHAPES, None
        for kind in kinds:
            try:
                native_ops.gemm_backends(KINDS[kind], "native", dev)
            except (RuntimeError, ValueError) as e:
                print(f"skipped {kind}: {e}")
            else:
                run.append(kind)
        if not run:
            print("no native kind runs on this device: nothing to measure (try --cpu-check)")
            return 0
    print(
        "\nmax |native - simulated| / max |simulated| per GEMM (simulated: FP32, HIGHEST, same\n"
        "operands); a training step of the 4-block LM under the kind's recipe simulated and\n"
        f"native and under bf16: first call (compile) s and median ms of {args.reps} steps\n"
    )
    cols = ["kind", "Fprop y", "Dgrad dx", "Wgrad dw", "parity"]
    cols += [f"{w} {m}" for m in ("ms/step", "compile s") for w in ("simulated", "native", "bf16")]
    print("| " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * 3 + "---|" + "---:|" * 6)
    ok_all = True
    for kind in run:
        errs, verdict = parity(kind, shapes, matmul)
        ok_all &= verdict == "ok"
        cells = [f"{e:.2e}" for e in errs] if errs else ["-"] * 3
        steps = ["-"] * 6
        if not args.cpu_check and errs:
            try:
                t = lm_step(kind, args.reps, args.warmup)
                steps = [f"{t[w][1]:.2f}" for w in t] + [f"{t[w][0]:.1f}" for w in t]
            except Exception as e:
                verdict += f"; step failed: {_first(e)}"
        print("| " + " | ".join([kind, *cells, verdict, *steps]) + " |")
    print(f"\nparity within {TOL:.0e}: {'all ok' if ok_all else 'FAILED'}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
