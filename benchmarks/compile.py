"""XLA compile time and size of the quantizer, the quantized GEMM and a training step.

Compiles each case from scratch (`jax.jit(f).lower(*args).compile()` on a fresh function
object after `jax.clear_caches()`) and prints a markdown table of the median trace + lower
seconds, the median compile seconds and the line count of the optimized HLO:

  qdq <spec>          jitted `quantize_dequantize(x, spec)` on a 256x256 float32 array: nvfp4
                      1x16, nvfp4 16x16, nvfp4 with stochastic rounding (threefry bits from a
                      key argument), mxfp4, nvfp4 four-over-six (mae)
  qdot <recipe>       `jax.grad` (fwd + bwd) of one 256x64 @ 64x64 `qdot_general` under the
                      recipe, with the loss summing the output; "+telemetry" passes a probe
                      (as fp4lab.nnx.op does) and returns the forward and backward statistics
  step <recipe>       one training step (fwd + bwd + adam) of the tiny Llama-style LM of
                      benchmarks/step.py --quick (2 blocks, 14 quantized linears, lm_head in
                      high precision), "+telemetry" with fp4lab.telemetry.value_and_grad;
                      "<n> blocks" at depth n, unrolled or with the blocks under nnx.scan
                      (TransformerConfig.scan_layers: one block compiled, whatever the depth),
                      fp32 beside nvfp4 at each depth; the first-call ratios and goals follow

The compiles run in rounds, every row once per round (in reverse order every other round), so
a ratio pairs two rows compiled in the same round; the first-call goals are judged on those
per-round ratios: their median, and with 6 rounds or more the sign test's 95 % interval of it
(`benchmarks/timing.py`), which says when the rounds cannot tell. Compile time depends on the
machine and its load; compare rows measured in one run.

    python benchmarks/compile.py               # all rows, 3 rounds
    python benchmarks/compile.py --no-step     # the quantizer and qdot rows only (seconds)
    python benchmarks/compile.py --quick       # the depth rows once each (the first-call goals)
    python benchmarks/compile.py --only "4 blocks, scan" --reps 9   # the scanned goal, decided
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from timing import goal_verdict, machine, round_ratios  # benchmarks/timing.py

import fp4lab as fl
from fp4lab.core.quantize import quantize_dequantize
from fp4lab.models.transformer import Transformer, TransformerConfig
from fp4lab.nnx import telemetry
from fp4lab.nnx.rules import Rule, quantize_model
from fp4lab.ops.dot_general import qdot_general

DN = (((1,), (0,)), ((), ()))  # (M, K) @ (K, N)


def qdq_case(spec, stochastic: bool = False):
    """(function factory, args): a fresh jittable quantize_dequantize per call."""
    x = jax.random.normal(jax.random.key(0), (256, 256), jnp.float32)
    if stochastic:
        return (lambda: lambda x, k: quantize_dequantize(x, spec, key=k)), (x, jax.random.key(1))
    return (lambda: lambda x: quantize_dequantize(x, spec)), (x,)


def qdot_case(recipe: str, measure: bool):
    """(function factory, args): grads of sum(qdot_general(x, w)) (and the statistics)."""
    x = jax.random.normal(jax.random.key(0), (256, 64), jnp.float32)
    w = jax.random.normal(jax.random.key(1), (64, 64), jnp.float32) * 0.1
    key = jax.random.key(2)
    if not measure:

        def make():
            def loss(x, w, key):
                return jnp.sum(qdot_general(x, w, DN, recipe, key=key))

            return jax.grad(loss, argnums=(0, 1))

        return make, (x, w, key)
    probe = jnp.zeros((len(telemetry.BWD_OPERANDS), len(telemetry.STATS)), jnp.float32)

    def make():
        def loss(x, w, probe, key):
            y, fstats = qdot_general(x, w, DN, recipe, key=key, probe=probe)
            return jnp.sum(y), fstats

        return jax.grad(loss, argnums=(0, 1, 2), has_aux=True)

    return make, (x, w, probe, key)


def step_case(recipe: str, measure: bool, scan: bool = False, layers: int = 2):
    """(function factory, args): one pure training step of the tiny LM on (state, tokens)."""
    cfg = TransformerConfig(
        vocab=256, d_model=64, n_layers=layers, n_heads=4, d_ff=256, max_len=32, scan_layers=scan
    )
    tokens = jax.random.randint(jax.random.key(1), (4, 33), 0, cfg.vocab)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    if recipe is not None:
        rules = [Rule(r".*lm_head.*", None), Rule(r".*", recipe)]
        quantize_model(model, rules, key=jax.random.key(0), telemetry=measure)
    opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    graphdef, state = nnx.split((model, opt))

    def loss_fn(model, tokens):
        logits = model(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    def make():
        def step(state, tokens):
            model, opt = nnx.merge(graphdef, state)
            if measure:
                loss, grads, metrics = telemetry.value_and_grad(loss_fn)(model, tokens)
            else:
                (loss, grads), metrics = nnx.value_and_grad(loss_fn)(model, tokens), {}
            opt.update(model, grads)
            return loss, metrics, nnx.state((model, opt))

        return step

    return make, (state, tokens)


def cases(with_step: bool) -> dict:
    nv = fl.nvfp4()
    rows = {
        "qdq nvfp4 1x16": qdq_case(nv),
        "qdq nvfp4 16x16": qdq_case(fl.nvfp4(tile=(16, 16))),
        "qdq nvfp4 stochastic": qdq_case(nv.replace(rounding="stochastic"), stochastic=True),
        "qdq mxfp4": qdq_case(fl.mxfp4()),
        "qdq nvfp4 four-over-six": qdq_case(fl.nvfp4(four_over_six="mae")),
    }
    for recipe in ("nvfp4", "mxfp4", "bf16"):
        rows[f"qdot {recipe}"] = qdot_case(recipe, False)
        rows[f"qdot {recipe} +telemetry"] = qdot_case(recipe, True)
    if with_step:
        rows["step bf16"] = step_case("bf16", False)
        rows["step nvfp4"] = step_case("nvfp4", False)
        rows["step nvfp4 +telemetry"] = step_case("nvfp4", True)
        for layers in (2, 4, 8):  # compile time against depth, unrolled blocks vs nnx.scan
            for recipe in ("fp32", "nvfp4"):
                r = None if recipe == "fp32" else recipe
                rows[f"step {recipe}, {layers} blocks"] = step_case(r, False, False, layers)
                rows[f"step {recipe}, {layers} blocks, scan"] = step_case(r, False, True, layers)
    return rows


def compile_once(make, args) -> tuple[float, float, int]:
    """(trace + lower seconds, compile seconds, optimized HLO lines) of one fresh compile."""
    jax.clear_caches()
    f = jax.jit(make())  # a new function object: nothing cached from the last round
    t0 = time.perf_counter()
    lowered = f.lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, len(compiled.as_text().splitlines())


def measure(rows: dict, reps: int) -> dict[str, list[tuple[float, float, int]]]:
    """{row: [compile_once's result per round]}: `reps` rounds, every row once per round, in
    reverse order every other round (a ratio then pairs compiles of the same round)."""
    out: dict[str, list] = {name: [] for name in rows}
    names = list(rows)
    for r in range(reps):
        for name in names if r % 2 == 0 else names[::-1]:
            make, args = rows[name]
            out[name].append(compile_once(make, args))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3, help="rounds: fresh compiles per row")
    p.add_argument("--no-step", action="store_true", help="skip the training-step rows")
    p.add_argument("--only", default=None, help="only rows whose name contains this")
    p.add_argument(
        "--quick", action="store_true", help="the depth rows, one compile each (--only blocks)"
    )
    args = p.parse_args(argv)
    print(machine())  # the CPU, its vector extensions and the kernel clone
    if args.quick:
        args.reps, args.only = 1, args.only or "blocks"

    rows = cases(not args.no_step)
    if args.only:
        rows = {k: v for k, v in rows.items() if args.only in k}
    dev = jax.devices()[0]
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    times = measure(rows, args.reps)
    print(
        f"compile from scratch on {dev.platform} ({dev.device_kind}), {os.cpu_count()} CPUs, "
        f"jax {jax.__version__}; medians of {args.reps} rounds"
        + (f"; load average at the start {load[0]:.2f}" if load else "")
    )
    print()
    print("| case | trace + lower s | compile s | optimized HLO lines |")
    print("|---|---:|---:|---:|")
    first = {}
    for name, runs in times.items():
        lo = statistics.median(t[0] for t in runs)
        co = statistics.median(t[1] for t in runs)
        first[name] = [t[0] + t[1] for t in runs]
        print(f"| {name} | {lo:.2f} | {co:.2f} | {runs[-1][2]} |")
    goals(first)
    if hasattr(os, "getloadavg"):
        load = os.getloadavg()
        print()
        print(f"load average at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}")


GOAL_VS_FP32 = 2.5  # nvfp4 first call (trace + lower + compile) at 4 blocks, against fp32's
GOAL_DEPTH = 1.3  # scanned nvfp4 at 8 blocks against 4 blocks


def goals(first: dict[str, list[float]]) -> None:
    """The first-call goals, from the depth rows measured in this run: {row: first-call
    seconds per round}, judged on the per-round ratios (`timing.goal_verdict`)."""
    print()
    for layout in ("", ", scan"):
        for layers in (2, 4, 8):
            nv, fp = (first.get(f"step {r}, {layers} blocks{layout}") for r in ("nvfp4", "fp32"))
            if nv is not None and fp is not None:
                ratio = statistics.median(round_ratios(nv, fp))
                print(f"nvfp4 / fp32 first call, {layers} blocks{layout}: {ratio:.2f}x")
    for layout, name in (("", "unrolled"), (", scan", "scanned")):
        nv4, fp4 = (first.get(f"step {r}, 4 blocks{layout}") for r in ("nvfp4", "fp32"))
        if nv4 is not None and fp4 is not None:
            goal = f"nvfp4 first call <= {GOAL_VS_FP32}x fp32's at 4 blocks ({name})"
            ratios = round_ratios(nv4, fp4)
            verdict = goal_verdict(ratios, GOAL_VS_FP32)
            print(f"goal: {goal}: {statistics.median(ratios):.2f}x -> {verdict}")
    s8, s4 = first.get("step nvfp4, 8 blocks, scan"), first.get("step nvfp4, 4 blocks, scan")
    if s8 is not None and s4 is not None:
        ratios = round_ratios(s8, s4)
        verdict = goal_verdict(ratios, GOAL_DEPTH)
        print(
            f"goal: scanned 8 blocks <= {GOAL_DEPTH}x 4 blocks: "
            f"{statistics.median(ratios):.2f}x -> {verdict}"
        )


if __name__ == "__main__":
    main()
