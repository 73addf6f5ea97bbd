"""Time of one training step of the Llama-style LM under each recipe, side by side.

One step is forward + backward + an optax.adam update under nnx.jit, next-token cross-entropy
on random tokens, for

  fp32                 the unquantized model (the reference)
  bf16, nvfp4, nvfp4-rl, mxfp4-h16
                       quantize_model(model, [Rule(".*lm_head.*", None), Rule(".*", name)]),
                       simulated backend
  nvfp4 +telemetry     quantize_model(..., telemetry=True) and fp4lab.telemetry.value_and_grad
                       (operand statistics of every GEMM, every step)
  nvfp4 +telemetry +shadow
                       value_and_grad(..., shadow=True): also the high-precision shadow in the
                       same jitted step, its exact gradients (grad/ statistics) and the drift
                       of every layer's output and output cotangent (acc/ statistics)
  qwix nvfp4           qwix's NVFP4 quantized training (QtProvider) on the same projections
                       and MLP layers (lm_head in high precision), when qwix is installed: all
                       six GEMM operands in 1x16 blocks with E4M3 scales, but no tensor scale,
                       no 2D weight tiles, no stochastic rounding and no Hadamard, so a lighter
                       recipe than fp4lab's nvfp4

All rows live in one process. Each step function is compiled and warmed up first (the first
call's time, trace + compile + one step, is reported), then timed in interleaved rounds (every
row once per round, in a shuffled order), each call ended with block_until_ready; the table
gives medians, and the fastest step (less sensitive to other processes on a shared machine).
The goals are judged on the per-round ratios of the two rows they compare: their median, and
the sign test's 95 % interval of it (`benchmarks/timing.py`); a goal whose interval holds the
goal's ratio is reported as not decided by the rounds, not as met.

    python benchmarks/step.py            # d_model 256, 4 layers, seq 128, batch 16
    python benchmarks/step.py --quick    # tiny shapes, a smoke test
    python benchmarks/step.py --rows "nvfp4,nvfp4 +telemetry,nvfp4 +telemetry +shadow"
    python benchmarks/step.py --blocks 2,4,8 --scan both   # every depth, unrolled and scanned

With several depths or both block layouts, each (depth, layout) gets its own table, with ratios
to the fp32 step of the same depth and layout, all measured in the one process (the qwix row
runs on unrolled blocks only).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import statistics
import time
import warnings

import jax
import optax
from flax import nnx
from timing import goal_verdict, interleaved, round_ratios  # benchmarks/timing.py

from fp4lab.models.transformer import Transformer, TransformerConfig
from fp4lab.nnx import telemetry
from fp4lab.nnx.rules import Rule, quantize_model

GOAL_NVFP4 = 1.5  # nvfp4 step at most this many times the fp32 step
GOAL_TELEMETRY = 1.2  # telemetry at most this many times the same step without it
GOAL_SHADOW = 2.2  # telemetry + the shadow at most this many times the step without them

RECIPES = ("bf16", "nvfp4", "nvfp4-rl", "mxfp4-h16")
TELEMETRY = "nvfp4 +telemetry"
SHADOW = "nvfp4 +telemetry +shadow"
QWIX = "qwix nvfp4"
ROWS = [*RECIPES, TELEMETRY, SHADOW, QWIX]  # timed besides fp32


def loss_fn(model, tokens):
    logits = model(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def plain_step(model, opt, tokens):
    loss, grads = nnx.value_and_grad(loss_fn)(model, tokens)
    opt.update(model, grads)
    return loss


def telemetry_step(model, opt, tokens):
    loss, grads, metrics = telemetry.value_and_grad(loss_fn)(model, tokens)
    opt.update(model, grads)
    return loss, metrics


def shadow_step(model, opt, tokens):
    loss, grads, metrics = telemetry.value_and_grad(loss_fn, shadow=True)(model, tokens)
    opt.update(model, grads)
    return loss, metrics


def rules(name: str) -> list:
    return [Rule(r".*lm_head.*", None), Rule(r".*", name)]


def qwix_model(qwix, cfg: TransformerConfig, tokens):
    """The model under qwix's NVFP4 quantized training: forward operands and gradients NVFP4
    with 1x16 tiles along the contraction axis, the projections and MLP layers only."""
    rule = qwix.QtRule(
        module_path=r".*blocks.*(query|key|value|out|gate|up|down).*",
        op_names=("dot_general",),
        weight_qtype="nvfp4",
        act_qtype="nvfp4",
        bwd_qtype="nvfp4",
        tile_size=16,
        bwd_weight_grad_tile_size=16,
        additional_qt_config={"dlhs_tile_size": 16},  # qwix tiles only the Wgrad by default
    )
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    return qwix.quantize_model(model, qwix.QtProvider([rule]), tokens[:, :-1])


def build(cfg: TransformerConfig, tokens, qwix, wanted) -> dict:
    """{row: (jitted step, model, optimizer)} of fp32 and the `wanted` rows."""
    rows = {}

    def add(name, model, step):
        opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
        rows[name] = (nnx.jit(step), model, opt)

    add("fp32", Transformer(cfg, rngs=nnx.Rngs(0)), plain_step)
    for name in [r for r in RECIPES if r in wanted]:
        model = Transformer(cfg, rngs=nnx.Rngs(0))
        quantize_model(model, rules(name), key=jax.random.key(0))
        add(name, model, plain_step)
    for name, step in ((TELEMETRY, telemetry_step), (SHADOW, shadow_step)):
        if name not in wanted:
            continue
        model = Transformer(cfg, rngs=nnx.Rngs(0))
        quantize_model(model, rules("nvfp4"), key=jax.random.key(0), telemetry=True)
        add(name, model, step)
    if qwix is not None and QWIX in wanted:
        add(QWIX, qwix_model(qwix, cfg, tokens), plain_step)
    return rows


def measure(rows: dict, tokens, reps: int, warmup: int) -> tuple[dict, dict, dict, dict]:
    """(first-call seconds, median ms per step, fastest ms per step, seconds of each round) per
    row."""
    first = {}
    for name, (step, model, opt) in rows.items():
        t0 = time.perf_counter()
        jax.block_until_ready(step(model, opt, tokens))
        first[name] = time.perf_counter() - t0
        for _ in range(warmup):
            jax.block_until_ready(step(model, opt, tokens))
        print(f"  compiled {name}: first call {first[name]:.1f} s", flush=True)
    calls = {
        name: functools.partial(step, model, opt, tokens)
        for name, (step, model, opt) in rows.items()
    }
    times = interleaved(calls, reps)
    median = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
    return first, median, {name: 1e3 * min(ts) for name, ts in times.items()}, times


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=10, help="timed steps per row")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
    p.add_argument("--quick", action="store_true", help="tiny shapes (a smoke test)")
    p.add_argument("--blocks", default=None, help="comma-separated depths (default: 4; 2 quick)")
    p.add_argument(
        "--scan",
        choices=("no", "yes", "both"),
        default="no",
        help="blocks unrolled (no), under nnx.scan (yes) or both",
    )
    rows = ", ".join(ROWS)
    p.add_argument(
        "--rows",
        help=f"comma-separated rows to time besides fp32 (default all: {rows})",
    )
    args = p.parse_args(argv)
    wanted = ROWS if args.rows is None else [r.strip() for r in args.rows.split(",")]
    unknown = sorted(set(wanted) - set(ROWS))
    if unknown:
        p.error(f"unknown rows {unknown}; known: {rows}")

    if args.quick:
        base = TransformerConfig(vocab=256, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_len=32)
        seq, batch = 32, 4
    else:
        base = TransformerConfig(
            vocab=256, d_model=256, n_layers=4, n_heads=4, d_ff=1024, max_len=128
        )
        seq, batch = 128, 16
    depths = [base.n_layers] if args.blocks is None else [int(b) for b in args.blocks.split(",")]
    scans = {"no": [False], "yes": [True], "both": [False, True]}[args.scan]
    tokens = jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, base.vocab)

    try:
        import qwix
    except ImportError:
        qwix = None
        print("qwix is not installed: the qwix row is skipped")

    results = []
    for depth in depths:
        for scan in scans:
            cfg = dataclasses.replace(base, n_layers=depth, scan_layers=scan)
            print(f"{depth} blocks, {'scanned' if scan else 'unrolled'}:", flush=True)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # e.g. jax's deprecation notes from qwix
                rows = build(cfg, tokens, None if scan else qwix, wanted)
                results.append((cfg, measure(rows, tokens, args.reps, args.warmup)))
            jax.clear_caches()

    dev = jax.devices()[0]
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    for cfg, (first, ms, best, times) in results:
        print()
        print(
            f"train step (fwd + bwd + adam), d_model={cfg.d_model}, layers={cfg.n_layers} "
            f"({'scanned' if cfg.scan_layers else 'unrolled'}), heads={cfg.n_heads}, "
            f"d_ff={cfg.d_ff}, vocab={cfg.vocab}, seq={seq}, batch={batch}; "
            f"{dev.platform} ({dev.device_kind}), {os.cpu_count()} CPUs, jax {jax.__version__}; "
            f"median of {args.reps} steps after {args.warmup} warm-up steps"
        )
        report(first, ms, best, times)
    if load is not None:
        print(f"\nload average at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}")


def report(first: dict, ms: dict, best: dict, times: dict) -> None:
    """The table of one (depth, layout) and its goals, judged on the per-round ratios
    (`timing.goal_verdict`: their median and its interval)."""
    print()
    cols = ["recipe", "median ms/step", "ratio to fp32", "fastest ms/step", "ratio to fp32"]
    cols += ["first call s", "first call / fp32"]
    print("| " + " | ".join(cols) + " |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, t in ms.items():
        b, f = best[name], first[name]
        print(
            f"| {name} | {t:.1f} | {t / ms['fp32']:.2f}x | {b:.1f} | {b / best['fp32']:.2f}x "
            f"| {f:.1f} | {f / first['fp32']:.2f}x |"
        )

    print()
    goals = [
        ("nvfp4", "fp32", GOAL_NVFP4, "nvfp4", "fp32"),
        (TELEMETRY, "nvfp4", GOAL_TELEMETRY, "telemetry", "the nvfp4 step"),
        (SHADOW, "nvfp4", GOAL_SHADOW, "telemetry + shadow (gradients and drift)", "the step"),
    ]
    for row, base, goal, what, of in goals:
        if row not in times or base not in times:
            continue
        ratios = round_ratios(times[row], times[base])
        median = statistics.median(ratios)
        print(f"goal: {what} <= {goal}x {of}")
        print(f"  {median:.2f}x (median per-round ratio) -> {goal_verdict(ratios, goal)}")
    if QWIX in ms and "nvfp4" in ms:
        print(f"nvfp4 vs qwix nvfp4: {ms['nvfp4'] / ms[QWIX]:.2f}x qwix's step time")


if __name__ == "__main__":
    main()
