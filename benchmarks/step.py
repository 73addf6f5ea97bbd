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

`--model user`: a user's own unscanned model instead of the LM (`UserModel`: 4 residual blocks
of an RMSNorm and 3 nnx.Linear layers, d 256, h 1024, 2048 tokens as 16 x 128, MSE loss, adam),
fp32 beside quantize_model(model, [Rule(".*", "nvfp4")]) (all 12 GEMMs NVFP4, simulated), and
the same blocks stacked under nnx.scan for comparison. Each first call (trace, compile, one
step) starts from empty caches, in rounds of every row; then the steps run in interleaved
rounds. Goals, on per-round ratios: nvfp4 first call <= 2.0x fp32's, step <= 1.2x. `--split`
adds each row's trace, lower and compile seconds and the optimized program's size.
`--model user-ce`: the second user-style model (`MixBlock`: Linear 256->1024->256 and a
256 x 256 mix per block, all with biases, a head 256->64, softmax cross-entropy on integer
labels), with the same rows and goals.

    python benchmarks/step.py --model user --first-rounds 4 --reps 15 --split
    python benchmarks/step.py --model user-ce --first-rounds 4 --reps 15

Every table's header names the CPU, its vector extensions and the quantizer kernel's clone
(`timing.machine`); FP4LAB_CPU_CLONE=avx2 in the environment measures the AVX2 clone on an
AVX-512 CPU. The figures, per CPU, are in docs/performance.md.

The row "nvfp4 jnp quantizer" is the same nvfp4 model with its quantizers traced as the jnp
reference (FP4LAB_QUANTIZER=reference) instead of the CPU kernel (`fp4lab.core.kernel_route`): the
two give the same bits; the rows compare their cost in one process.

Measured (2 CPUs, load average 1.7 at the start, 1.7 at the end, its own threads; jax 0.10.2):

    row                  median ms/step  median first call s  compile s (CPU s)  HLO instr.  fusions
    fp32                      254.1            0.83              0.38 (0.62)         2,504       202
    nvfp4                     298.4            1.01              0.48 (0.77)         3,258       300
    fp32 scanned              300.7            0.97              0.56 (0.99)         1,259       105
    nvfp4 scanned             377.9            1.26              0.65 (1.12)         1,660       146
    nvfp4 jnp quantizer       360.9            4.83              3.75 (4.86)        46,157       957

    first call 1.22x fp32's (4 rounds): met;  step 1.18x [1.16, 1.20] (15 rounds): met
    jnp quantizer: first call 5.77x, step 1.43x; the kernel's step 0.83x the jnp quantizer's

Where the step went, and what changed it (jax.profiler traces, thread-milliseconds per step of
the nvfp4 row; an earlier version of this note measured 1.51x):
- The transposes beside the kernel: XLA writes the kernel's operand and result as bitcasts of
  the arrays beside it, and the Wgrad operands' transposes to the GEMM's layout read the
  kernel's 5-D blocked view; a bitcast that regroups major axes costs a transpose its tiling
  (6.3 ms each against 0.7 ms for the same transpose in fp32's program; 68 ms a step). The
  kernel's operand and result are now 2-D (`cpu_kernels.quantize_blocks`): 8 ms.
- The Wgrad operands' 16-point Hadamard: four stacked butterfly stages were four fusions,
  52 ms. It now runs in the quantizer kernel (the rotation's bits no longer hang on LLVM's
  multiply-add contraction, `fp4lab.core.hadamard`), so it costs no pass of its own.
- The kernel's per-block NVFP4 scale terms: a library call (nearbyint) per block, then a
  scalar loop; now an inline rounding in a vectorized loop. The quantizer calls: 74 ms before,
  69 ms with the rotation inside.
- Left: the matmuls take 117 ms (fp32's 169, whose matmul fusions also hold the elementwise
  work around them), the quantizer calls 69 ms, the rest as fp32's.
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
import jax.numpy as jnp
import optax
from flax import nnx
from timing import goal_verdict, interleaved, machine, round_ratios  # benchmarks/timing.py
from user_model import (  # benchmarks/user_model.py
    CLASSES,
    REFERENCE,
    compile_split,
    traced_as,
    user_rows,
)

from fp4lab.models.transformer import Transformer, TransformerConfig
from fp4lab.nnx import telemetry
from fp4lab.nnx.rules import Rule, quantize_model

GOAL_NVFP4 = 1.5  # nvfp4 step at most this many times the fp32 step
GOAL_TELEMETRY = 1.2  # telemetry at most this many times the same step without it
GOAL_SHADOW = 2.2  # telemetry + the shadow at most this many times the step without them
GOAL_USER_FIRST = 2.0  # a user's unscanned model: nvfp4 first call at most this times fp32's
GOAL_USER_STEP = 1.2  # ... and its nvfp4 step at most this many times the fp32 step

RECIPES = ("bf16", "nvfp4", "nvfp4-rl", "mxfp4-h16")
TELEMETRY = "nvfp4 +telemetry"
SHADOW = "nvfp4 +telemetry +shadow"
QWIX = "qwix nvfp4"
ROWS = [*RECIPES, REFERENCE, TELEMETRY, SHADOW, QWIX]  # timed besides fp32


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
    if REFERENCE in wanted:  # nvfp4, its quantizers traced as the jnp reference
        model = Transformer(cfg, rngs=nnx.Rngs(0))
        quantize_model(model, rules("nvfp4"), key=jax.random.key(0))
        opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
        rows[REFERENCE] = (traced_as(nnx.jit(plain_step), True), model, opt)
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


def measure_user(builders: dict, batch, rounds: int, reps: int, warmup: int):
    """(first-call seconds per round, median ms, fastest ms, seconds of each step round) per row.

    A first call (trace, compile, one step) is measured `rounds` times per row from empty
    caches (jax.clear_caches before each), in rounds of every row, reversed every other round;
    the steps are then timed in `interleaved` rounds as in `measure`."""
    first = {name: [] for name in builders}
    rows = {}
    for r in range(rounds):
        for name in builders if r % 2 == 0 else reversed(builders):
            jax.clear_caches()
            step, model, opt = rows[name] = builders[name]()
            t0 = time.perf_counter()
            jax.block_until_ready(step(model, opt, *batch))
            first[name].append(time.perf_counter() - t0)
            print(f"  round {r + 1}: {name} first call {first[name][-1]:.1f} s", flush=True)
    for step, model, opt in rows.values():  # compiles again where a later clear dropped it
        for _ in range(warmup + 1):
            jax.block_until_ready(step(model, opt, *batch))
    calls = {
        name: functools.partial(step, model, opt, *batch)
        for name, (step, model, opt) in rows.items()
    }
    times = interleaved(calls, reps)
    median = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
    return first, median, {name: 1e3 * min(ts) for name, ts in times.items()}, times


def report_user(first: dict, ms: dict, best: dict, times: dict) -> None:
    """The user-style model's table and its goals (nvfp4 against fp32, unscanned), with the
    scanned layout's ratios beside them; first-call and step ratios paired by round."""
    print()
    cols = ["row", "median ms/step", "fastest ms/step", "median first call s"]
    print("| " + " | ".join(cols) + " |")
    print("|---|---:|---:|---:|")
    for name, t in ms.items():
        print(f"| {name} | {t:.1f} | {best[name]:.1f} | {statistics.median(first[name]):.2f} |")
    print()
    for layout in ("", " scanned"):
        q, base = f"nvfp4{layout}", f"fp32{layout}"
        fr = round_ratios(first[q], first[base])
        sr = round_ratios(times[q], times[base])
        tag = "unscanned" if not layout else "scanned"
        if layout:
            print(
                f"{tag} (for comparison): first call {statistics.median(fr):.2f}x fp32's, "
                f"step {statistics.median(sr):.2f}x"
            )
            continue
        print(f"goal: {tag} nvfp4 first call <= {GOAL_USER_FIRST}x fp32's")
        print(f"  {statistics.median(fr):.2f}x -> {goal_verdict(fr, GOAL_USER_FIRST)}")
        print(f"goal: {tag} nvfp4 step <= {GOAL_USER_STEP}x fp32's")
        print(f"  {statistics.median(sr):.2f}x -> {goal_verdict(sr, GOAL_USER_STEP)}")
    if REFERENCE in first:
        fr = round_ratios(first[REFERENCE], first["fp32"])
        sr = round_ratios(times[REFERENCE], times["fp32"])
        kr = round_ratios(times["nvfp4"], times[REFERENCE])
        print(
            f"{REFERENCE} (unscanned, for comparison): first call {statistics.median(fr):.2f}x "
            f"fp32's, step {statistics.median(sr):.2f}x; the kernel's step "
            f"{statistics.median(kr):.2f}x the jnp quantizer's"
        )


def main_user(args) -> None:
    """The user-style model: 4 blocks (2 quick), d 256 (64), h 1024 (256), 2048 tokens (256)."""
    d, h, depth, batch, seq = (64, 256, 2, 4, 64) if args.quick else (256, 1024, 4, 16, 128)
    if args.blocks is not None:
        depth = int(args.blocks)
    kx, ky = jax.random.split(jax.random.key(1))
    classes = CLASSES if args.model == "user-ce" else 0
    x = jax.random.normal(kx, (batch, seq, d), jnp.float32)
    if classes:
        xy = (x, jax.random.randint(ky, (batch, seq), 0, classes))
        what = f"Linear {d}->{h}->{d} and a {d}x{d} mix, biases, head {d}->{classes}, CE"
    else:
        xy = (x, jax.random.normal(ky, (batch, seq, d), jnp.float32))
        what = f"RMSNorm and 3 Linear layers (d={d}, h={h}), MSE"
    load0 = os.getloadavg()
    rows = user_rows(d, h, depth, classes)
    first, ms, best, times = measure_user(rows, xy, args.first_rounds, args.reps, args.warmup)
    load1 = os.getloadavg()
    dev = jax.devices()[0]
    print()
    print(machine())
    print(
        f"user-style model ({args.model}): {depth} residual blocks of {what}, "
        f"{batch * seq} tokens, adam; nvfp4 = quantize_model(model, [Rule('.*', 'nvfp4')]); "
        f"{dev.platform} ({dev.device_kind}), {os.cpu_count()} CPUs, jax {jax.__version__}; "
        f"first calls over {args.first_rounds} rounds, median of {args.reps} steps"
    )
    report_user(first, ms, best, times)
    if args.split:
        compile_split(rows, xy)
    print(f"\nload average before: {load0[0]:.2f}; at the end: {load1[0]:.2f}, {load1[1]:.2f}")


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
    p.add_argument(
        "--model",
        choices=("lm", "user", "user-ce"),
        default="lm",
        help="the Llama-style LM (lm) or a user-style model of Linear blocks, unscanned and "
        "scanned (user: MSE; user-ce: biases and cross-entropy; --rows and --scan: lm only)",
    )
    p.add_argument(
        "--first-rounds",
        type=int,
        default=3,
        help="--model user: first calls per row, each from empty caches",
    )
    p.add_argument(
        "--split",
        action="store_true",
        help="--model user: also trace, lower and compile each row apart (seconds, HLO size)",
    )
    rows = ", ".join(ROWS)
    p.add_argument(
        "--rows",
        help=f"comma-separated rows to time besides fp32 (default all: {rows})",
    )
    args = p.parse_args(argv)
    print(machine())  # the CPU, its vector extensions and the kernel clone (again by the figures)
    if args.model in ("user", "user-ce"):
        if args.blocks is not None and not args.blocks.isdigit():
            p.error("--model user takes one depth in --blocks")
        main_user(args)
        return
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
    print()
    print(machine())
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
    if REFERENCE in times and "nvfp4" in times:
        ratios = round_ratios(times["nvfp4"], times[REFERENCE])
        print(
            f"nvfp4 (quantizers as the CPU kernel) vs {REFERENCE}: step "
            f"{statistics.median(ratios):.2f}x, first call {first['nvfp4'] / first[REFERENCE]:.2f}x"
        )


if __name__ == "__main__":
    main()
