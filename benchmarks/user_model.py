"""Users' own models for `benchmarks/step.py --model user|user-ce` (a sibling module).

Residual blocks written as users write them, looped in Python (unscanned) or stacked under
nnx.scan: `UserBlock` (an RMSNorm and three nnx.Linear layers, MSE loss; `--model user`) and
`MixBlock` (nnx.Linear d->h->d and a d x d mix, all with biases, under a head d->64 and softmax
cross-entropy; `--model user-ce`), and `compile_split`: where a row's first call goes.
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


class MixBlock(nnx.Module):
    """Linear d->h->d then a d x d mix, each residual, every layer with its bias."""

    def __init__(self, d: int, h: int, rngs: nnx.Rngs):
        self.up = nnx.Linear(d, h, rngs=rngs)
        self.down = nnx.Linear(h, d, rngs=rngs)
        self.mix = nnx.Linear(d, d, rngs=rngs)

    def __call__(self, x_BxTxD):
        x_BxTxD = x_BxTxD + self.down(jax.nn.gelu(self.up(x_BxTxD)))
        return x_BxTxD + self.mix(jax.nn.gelu(x_BxTxD))


CLASSES = 64  # the classifier head's outputs (`--model user-ce`)


class UserModel(nnx.Module):
    """`depth` blocks (UserBlock, or with `classes` MixBlock under a Linear head d->classes)
    in a Python loop (unscanned, as users' models mostly are), or the same blocks stacked and
    applied with nnx.scan (the same initial parameters)."""

    def __init__(self, d: int, h: int, depth: int, scan: bool, rngs: nnx.Rngs, classes: int = 0):
        kind = MixBlock if classes else UserBlock
        blocks = [kind(d, h, rngs) for _ in range(depth)]
        self.head = nnx.Linear(d, classes, rngs=rngs) if classes else None
        self.scan = scan
        if scan:
            graphdef, _ = nnx.split(blocks[0])
            stacked = jax.tree.map(lambda *a: jnp.stack(a), *[nnx.state(b) for b in blocks])
            self.blocks = nnx.merge(graphdef, stacked)
        else:
            self.blocks = nnx.List(blocks)

    def __call__(self, x_BxTxD):
        if self.scan:
            x_BxTxD = _scan_user_blocks(x_BxTxD, self.blocks)
        else:
            for block in self.blocks:
                x_BxTxD = block(x_BxTxD)
        return x_BxTxD if self.head is None else self.head(x_BxTxD)


@nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
def _scan_user_blocks(x_BxTxD, block):
    return block(x_BxTxD)


def user_step(model, opt, x_BxTxD, y_BxTxD):
    """One adam step: MSE against y (float), or softmax cross-entropy against labels y (int)."""

    def loss(model):
        out = model(x_BxTxD)
        if jnp.issubdtype(y_BxTxD.dtype, jnp.integer):
            return optax.softmax_cross_entropy_with_integer_labels(out, y_BxTxD).mean()
        return jnp.mean((out - y_BxTxD) ** 2)

    value, grads = nnx.value_and_grad(loss)(model)
    opt.update(model, grads)
    return value


REFERENCE = "nvfp4 jnp quantizer"  # the row whose quantizers run the jnp reference


@contextlib.contextmanager
def forced(**env: str):
    """The environment variables `env` set inside (e.g. FP4LAB_CPU_CLONE="avx2"), restored after."""
    old = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def reference_quantizer(on: bool = True):
    """Quantizers traced inside run the jnp reference, not the CPU kernel
    (`fp4lab.core.kernel_route`)."""
    return forced(FP4LAB_QUANTIZER="reference") if on else forced()


def traced_as(jitted, reference: bool):
    """`jitted`, (re)tracing under `reference_quantizer(reference)` whenever it traces."""

    def step(*args):
        with reference_quantizer(reference):
            return jitted(*args)

    return step


def user_rows(d: int, h: int, depth: int, classes: int = 0) -> dict:
    """{row: function building (jitted step, model, optimizer)}: the user-style model in fp32
    and with all its GEMMs NVFP4 (simulated), unscanned and scanned, and unscanned NVFP4 with
    the jnp reference quantizer (`REFERENCE`; its step traces with FP4LAB_QUANTIZER=reference)."""

    def builder(recipe, scan, reference=False):
        def build():
            model = UserModel(d, h, depth, scan, rngs=nnx.Rngs(0), classes=classes)
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
