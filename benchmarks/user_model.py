"""A user's own model for `benchmarks/step.py --model user` (imported as a sibling module).

Residual blocks of three nnx.Linear layers written as users write them, looped in Python
(unscanned) or stacked under nnx.scan, and `compile_split`: where a row's first call goes.
"""

from __future__ import annotations

import contextlib
import os
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from fp4lab.nnx.rules import Rule, quantize_model


class UserBlock(nnx.Module):
    """A residual block of three Linear layers, written as a user writes one."""

    def __init__(self, d: int, h: int, rngs: nnx.Rngs):
        self.norm = nnx.RMSNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, h, rngs=rngs)
        self.mid = nnx.Linear(h, h, rngs=rngs)
        self.down = nnx.Linear(h, d, rngs=rngs)

    def __call__(self, x_BxTxD):
        h_BxTxH = jax.nn.gelu(self.mid(jax.nn.gelu(self.up(self.norm(x_BxTxD)))))
        return x_BxTxD + self.down(h_BxTxH)


class UserModel(nnx.Module):
    """`depth` UserBlocks in a Python loop (unscanned, as users' models mostly are), or the
    same blocks stacked and applied with nnx.scan (the same initial parameters)."""

    def __init__(self, d: int, h: int, depth: int, scan: bool, rngs: nnx.Rngs):
        blocks = [UserBlock(d, h, rngs) for _ in range(depth)]
        self.scan = scan
        if scan:
            graphdef, _ = nnx.split(blocks[0])
            stacked = jax.tree.map(lambda *a: jnp.stack(a), *[nnx.state(b) for b in blocks])
            self.blocks = nnx.merge(graphdef, stacked)
        else:
            self.blocks = nnx.List(blocks)

    def __call__(self, x_BxTxD):
        if self.scan:
            return _scan_user_blocks(x_BxTxD, self.blocks)
        for block in self.blocks:
            x_BxTxD = block(x_BxTxD)
        return x_BxTxD


@nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
def _scan_user_blocks(x_BxTxD, block: UserBlock):
    return block(x_BxTxD)


def user_step(model, opt, x_BxTxD, y_BxTxD):
    def loss(model):
        return jnp.mean((model(x_BxTxD) - y_BxTxD) ** 2)

    value, grads = nnx.value_and_grad(loss)(model)
    opt.update(model, grads)
    return value


REFERENCE = "nvfp4 jnp quantizer"  # the row whose quantizers run the jnp reference


@contextlib.contextmanager
def reference_quantizer(on: bool = True):
    """Quantizers traced inside run the jnp reference, not the CPU kernel (`fp4lab.core.fused`)."""
    old = os.environ.get("FP4LAB_QUANTIZER")
    if on:
        os.environ["FP4LAB_QUANTIZER"] = "reference"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("FP4LAB_QUANTIZER", None)
        else:
            os.environ["FP4LAB_QUANTIZER"] = old


def traced_as(jitted, reference: bool):
    """`jitted`, (re)tracing under `reference_quantizer(reference)` whenever it traces."""

    def step(*args):
        with reference_quantizer(reference):
            return jitted(*args)

    return step


def user_rows(d: int, h: int, depth: int) -> dict:
    """{row: function building (jitted step, model, optimizer)}: the user-style model in fp32
    and with all its GEMMs NVFP4 (simulated), unscanned and scanned, and unscanned NVFP4 with
    the jnp reference quantizer (`REFERENCE`; its step traces with FP4LAB_QUANTIZER=reference)."""

    def builder(recipe, scan, reference=False):
        def build():
            model = UserModel(d, h, depth, scan, rngs=nnx.Rngs(0))
            if recipe is not None:
                quantize_model(model, [Rule(r".*", recipe)], key=jax.random.key(0))
            step = traced_as(nnx.jit(user_step), reference)
            return step, model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

        return build

    rows = {
        f"{name}{' scanned' if scan else ''}": builder(recipe, scan)
        for scan in (False, True)
        for name, recipe in (("fp32", None), ("nvfp4", "nvfp4"))
    }
    rows[REFERENCE] = builder("nvfp4", False, reference=True)
    return rows


def compile_split(builders: dict, batch) -> None:
    """Where each row's first call goes: trace, lower (to StableHLO) and XLA's compile, each
    from empty caches, in wall and process CPU seconds (the CPU seconds of all threads, less
    sensitive to a loaded machine), and the size of the optimized program: HLO instructions and
    fusions (XLA's CPU backend compiles a kernel per distinct fusion)."""
    print("\n| row | trace s | lower s | compile s | compile CPU s | HLO instructions | fusions |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, build in builders.items():
        jax.clear_caches()
        _, model, opt = build()
        graphdef, state = nnx.split((model, opt))

        def pure(state, *batch, graphdef=graphdef):
            model, opt = nnx.merge(graphdef, state)
            loss = user_step(model, opt, *batch)
            return loss, nnx.state((model, opt))

        t0 = time.perf_counter()
        with reference_quantizer(name == REFERENCE):
            traced = jax.jit(pure).trace(state, *batch)
        t1 = time.perf_counter()
        lowered = traced.lower()
        t2, c2 = time.perf_counter(), time.process_time()
        hlo = lowered.compile().as_text()
        t3, c3 = time.perf_counter(), time.process_time()
        n = sum(" = " in line for line in hlo.splitlines())
        print(
            f"| {name} | {t1 - t0:.2f} | {t2 - t1:.2f} | {t3 - t2:.2f} | {c3 - c2:.2f} | {n} "
            f"| {hlo.count(' fusion(')} |"
        )
