"""Stage 1's measurements: every gate variant of one model, at fixed weights, in one program.

`Probe(task, recipe)` builds the task's model under `recipe` with gates in front of every
quantized op (`fp4lab.diagnosis.gate`), and compiles one program

    measure(params, rest, batch, variants) -> {metric: (V, ...)}, shadow loss

that runs the high-precision shadow (all gates 0) and each row of `variants` (V, 3 * sites) on
the same weights, batch and quantization keys, and compares each variant with the shadow:

    loss         the variant's loss on the batch
    grad_rel     ||g_v - g|| / ||g|| over every parameter (g: the shadow's gradient)
    grad_cos     cos(g_v, g)
    update_loss  1 - <g, g_v> / ||g||^2: the share of the first-order loss decrease of one
                 gradient step that a step along g_v loses (the step size cancels)
    step_loss    -lr <g, u(g_v)>: the first-order loss change of the optimizer's first step
                 along g_v, u its update (Adam: g_v / (|g_v| + eps), every weight moved by lr
                 in its gradient's sign; SGD: g_v); the shadow's own is `step`. First order
                 only: the step's curvature term, (lr^2 / 2) u'Hu, is typically largest for
                 the shadow's own update (aligned with g, so with the directions of high
                 curvature), so the whole step credits a noisier gradient with a larger loss
                 decrease (docs/diagnose.md: the sign bias this removes)
    y, dy        (V, sites): ||a_v - a|| / ||a|| of each layer's output and of the cotangent
                 arriving at it (the accumulated drift, forward and backward)
    dx, dw       (V, sites): the same for the gradients each layer's Dgrad and Wgrad give

The weights, the rest of the model's state (its quantization keys: a quant seed is other
numbers there, `rest_for`), the batch and the variants are arguments of fixed shapes: one trace
and one compile serve every checkpoint, batch, quant seed and variant (`compiles` counts them).
`checkpoints` trains the model a short while under the recipe (the trainer's optimizer and
batches) and keeps the weights at the steps asked for; a model that did not learn there (its
training batches' loss under a high-precision forward did not fall from its untrained value by
more than the batch-to-batch noise) stops the diagnosis with a sentence that says so.
"""

from __future__ import annotations

import math
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from fp4lab.core import formats, recipes
from fp4lab.core.stats import cosine, relative_drift
from fp4lab.diagnosis import gate
from fp4lab.nnx.rules import Rule, quantize_model
from fp4lab.train import summary
from fp4lab.train.config import Config
from fp4lab.train.tasks import Task, eval_batch, init_model, train_batch
from fp4lab.train.trainer import make_keys, make_optimizer

__all__ = ["Probe", "KINDS", "variants", "checkpoints"]

KINDS = ("y", "dx", "dw", "dy")  # per-layer drifts, `Probe.measure`
_LANE = {"fprop": "y", "dgrad": "dx", "wgrad": "dw"}  # the tensor each GEMM gives


def variants(n_sites: int) -> np.ndarray:
    """The gate rows stage 1 measures, (1 + 2K, K) with K = 3 * n_sites: all quantized; each
    GEMM alone quantized (row 1 + k); each GEMM alone kept in high precision (row 1 + K + k)."""
    k = 3 * n_sites
    eye = np.eye(k, dtype=np.float32)
    return np.concatenate([np.ones((1, k), np.float32), eye, 1 - eye])


class Probe:
    """The task's model under `recipe`, gated, and its one compiled measuring program."""

    def __init__(
        self, task: Task, recipe, keys: dict, *, step=("adamw", 1e-3, 1e-8), exclude=(),
        chunk: int = 16,
    ):  # fmt: skip
        """task: a `fp4lab.train.tasks.Task`; recipe: the quantized recipe (name or value);
        keys: the streams (`make_keys`) whose init builds the model and whose data gives the
        batch traced for shapes. step: (optimizer, lr, eps) of `step_loss` (`step_of`).
        exclude: path regexes left unquantized (no gates). chunk: variants vectorized at a
        time."""
        self.task, self.recipe = task, recipes.get(recipe)
        self.step = step
        self.rules = _rules(self.recipe, exclude)
        self.chunk = chunk
        self.model = self._model(keys, jax.random.fold_in(keys["quant"], 0))
        self.trace = gate.attach(self.model, task.loss, eval_batch(task, keys, 0))
        self.sites = gate.sites(self.model, self.trace)
        self.graphdef = nnx.graphdef(self.model)
        self._traces = 0
        self._measure = jax.jit(self._program)
        self._compiled = {}  # {argument shapes: the compiled program}
        self.compile_s = 0.0  # seconds spent compiling (`measure`)

    def _model(self, keys, qkey):
        model = init_model(self.task, keys)
        excluded = [r.path for r in self.rules if r.recipe is None]
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            quantize_model(model, self.rules, key=qkey)
        for w in said:  # said again, but the recipe's rule finding nothing the excluded left
            if not (excluded and "rule '.*' matched no module" in str(w.message)):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        try:
            return gate.gate_model(model)
        except ValueError as e:
            if not excluded:
                raise
            raise ValueError(
                f"diagnose: every quantized layer is excluded ({', '.join(map(repr, excluded))}:"
                " --exclude and the file's high-precision rules): nothing is left to diagnose"
            ) from e

    def rest_for(self, keys, quant_key) -> nnx.State:
        """The model's non-Param state (gates, taps, quantization keys) under a quant key."""
        model = self._model(keys, quant_key)
        for op, ref in zip(gate.gated_ops(model), gate.gated_ops(self.model), strict=True):
            for name in ("tap_x", "tap_w", "tap_y", "seen"):
                var = getattr(ref, name)
                setattr(op, name, type(var)(jnp.zeros_like(var[...])))
        gate.measure(model, True)
        return nnx.split(model, nnx.Param, ...)[2]

    def compiles(self) -> int:
        """How many times the measuring program was traced (one per compile)."""
        return self._traces

    def measure(self, params, rest, batch, gates: np.ndarray) -> tuple[dict, dict]:
        """({metric: (V, ...) numpy}, {"loss", "step"}: the shadow's loss and its `step_loss`)
        of the variants `gates` (V, 3 * sites)."""
        gates = jnp.asarray(gates, jnp.float32)
        args = (params, rest, batch, gates)
        shapes = str(jax.tree.map(lambda a: (a.shape, a.dtype), args))
        if shapes not in self._compiled:  # compiled ahead, so its seconds are known apart
            start = time.perf_counter()
            self._compiled[shapes] = self._measure.lower(*args).compile()
            self.compile_s += time.perf_counter() - start
        out, shadow = self._compiled[shapes](*args)
        return {k: np.asarray(v) for k, v in out.items()}, {k: float(v) for k, v in shadow.items()}

    def _update(self, g):
        """The optimizer's first update direction of a flat gradient `g` (Adam: g / (|g| +
        eps), every weight moved by lr in its gradient's sign; SGD: g)."""
        kind, _, eps = self.step
        return g / (jnp.abs(g) + eps) if kind == "adamw" else g

    def _outputs(self, params, rest, batch, gates):
        """(loss, flat gradient, {kind: [per-site tensors]}) of one gate vector."""
        # the model's own copies of the state: merge may reuse the state's variables, and the
        # gates, counters, outputs and taps are written below (each call from the same keys)
        model = nnx.merge(self.graphdef, params, jax.tree.map(lambda a: a, rest))
        gate.set_gates(model, gates)
        diff = nnx.DiffState(0, nnx.Any(nnx.Param, gate.Tap))
        loss, grads = nnx.value_and_grad(self.task.loss, argnums=diff)(model, batch)
        g_params, taps = nnx.split_state(grads, nnx.Param, gate.Tap)
        nnx.update(model, taps)
        flat = jnp.concatenate(
            [jnp.ravel(g).astype(jnp.float32) for g in jax.tree.leaves(g_params)]
        )
        ops = gate.gated_ops(model)
        lanes = {"y": "seen", "dx": "tap_x", "dw": "tap_w", "dy": "tap_y"}
        tensors = {k: [] for k in KINDS}
        for site in self.sites:
            op = ops[site.op]
            for kind, name in lanes.items():
                a = getattr(op, name)[...]
                tensors[kind].append(a[site.row] if op.stacked else a)
        return loss, flat, tensors

    def _program(self, params, rest, batch, gates):
        self._traces += 1
        zeros = jnp.zeros(gates.shape[-1], jnp.float32)
        loss_s, g_s, t_s = self._outputs(params, rest, batch, zeros)
        norm2 = jnp.maximum(jnp.vdot(g_s, g_s), jnp.finfo(jnp.float32).tiny)
        lr = self.step[1]
        shadow = {"loss": loss_s, "step": -lr * jnp.vdot(g_s, self._update(g_s))}

        def one(params, rest, row):
            loss, g, t = self._outputs(params, rest, batch, row)
            out = {
                k: jnp.stack([relative_drift(a, b) for a, b in zip(t[k], t_s[k], strict=True)])
                for k in KINDS
            }
            out["loss"] = loss
            out["grad_rel"] = relative_drift(g, g_s)
            out["grad_cos"] = cosine(g, g_s)
            out["update_loss"] = 1 - jnp.vdot(g_s, g) / norm2
            out["step_loss"] = -lr * jnp.vdot(g_s, self._update(g))
            return out

        # chunks of rows under vmap, one after another under scan; the weights ride in the
        # carry (an nnx model is merged at the trace level where it is changed)
        n, k = gates.shape
        size = min(self.chunk, n)
        pad = -n % size
        rows = jnp.concatenate([gates, jnp.zeros((pad, k), gates.dtype)]).reshape(-1, size, k)

        def body(carry, chunk):
            params, rest = carry
            return carry, jax.vmap(one, in_axes=(None, None, 0))(params, rest, chunk)

        out = jax.lax.scan(body, (params, rest), rows)[1]
        return {name: a.reshape(-1, *a.shape[2:])[:n] for name, a in out.items()}, shadow


def step_of(cfg: Config) -> tuple[str, float, float]:
    """(optimizer, lr, eps) of a config: the first step `step_loss` takes (its peak lr)."""
    return cfg.optimizer, float(cfg.lr), float(cfg.eps)


def lane(gemm: str) -> str:
    """The per-layer tensor a GEMM gives: Fprop y, Dgrad dx, Wgrad dw."""
    return _LANE[gemm]


def high_precision(recipe) -> bool:
    """Whether a rule's recipe keeps its layers out of FP4: None (unquantized), or a recipe
    (a name or a `GemmRecipe`) none of whose operand specs has an element format of 4 bits
    or fewer (bf16, fp8, mxfp8, ...)."""
    if recipe is None:
        return True
    gemm = recipes.get(recipe)
    fields = ("fprop_x", "fprop_w", "dgrad_dy", "dgrad_w", "wgrad_x", "wgrad_dy")
    specs = [getattr(gemm, f) for f in fields if getattr(gemm, f, None) is not None]
    return all(formats.get_format(spec.elem).bits > 4 for spec in specs)


def _rules(recipe, exclude) -> list[Rule]:
    """Each pattern of `exclude` unquantized, then every other layer under `recipe`."""
    return [*(Rule(path, None) for path in exclude), Rule(".*", recipe)]


def checkpoints(task: Task, cfg: Config, recipe, keys: dict, steps, *, exclude=()) -> list:
    """The model's Params after each of `steps` optimizer steps (0: at initialization) of one
    run under `recipe` (the layers of `exclude` unquantized) on the task's training batches,
    with the config's optimizer: one scanned program that keeps the weights at those steps."""
    steps = sorted(set(int(s) for s in steps))
    graph_hp, _, rest_hp = nnx.split(init_model(task, keys), nnx.Param, ...)  # the plain model
    model = init_model(task, keys)
    quantize_model(model, _rules(recipe, exclude), key=jax.random.fold_in(keys["quant"], 0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = make_optimizer(cfg)
    at = jnp.asarray(steps, jnp.int32)

    def step(carry, t):
        params, rest, opt_state, kept = carry
        m = nnx.merge(graphdef, params, rest)
        batch = train_batch(task, keys, t)
        grads = nnx.grad(task.loss, argnums=nnx.DiffState(0, nnx.Param))(m, batch)
        loss_hp = task.loss(nnx.merge(graph_hp, params, rest_hp), batch)  # before the update
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        hit = at == t + 1  # the checkpoints taken after this step

        def keep(buf, p):
            return jnp.where(hit.reshape(-1, *([1] * p.ndim)), p[None], buf)

        kept = jax.tree.map(keep, kept, params)
        return (params, nnx.state(m, nnx.Not(nnx.Param)), opt_state, kept), loss_hp

    kept = jax.tree.map(lambda p: jnp.broadcast_to(p, (len(steps), *p.shape)), params)
    carry = (params, rest, tx.init(params), kept)
    if steps[-1] > 0:
        carry, losses = jax.jit(lambda c: jax.lax.scan(step, c, jnp.arange(steps[-1])))(carry)
        _check_learned(np.asarray(losses), recipe)
    return [jax.tree.map(lambda b, i=i: b[i], carry[3]) for i in range(len(steps))]


def _check_learned(losses: np.ndarray, recipe) -> None:
    """Stops the diagnosis of a model that did not move from its untrained loss in its short
    run: its GEMMs would be ranked on an untrained model (a model at chance, a learning rate
    that moves nothing). Read on the training batches' loss under a high-precision forward,
    which the recipe's own quantization noise does not move, against the untrained model's:
    moved when mean(last quarter) is below the first step's loss by more than
    1.5 s sqrt(1 + 1 / w), 1.5 standard errors of the difference (s: `summary.batch_noise`,
    w: the quarter's steps). Lenient on purpose: a model that FP4 slows (what diagnose is
    for) still moved, while a model that moves nothing passes by chance about 7 % of the
    time; runs under 8 steps are not judged."""
    y = np.asarray(losses, np.float64)
    if len(y) < summary.MIN_LEARN_STEPS:
        return
    w = max(len(y) // 4, 2)
    s = summary.batch_noise(y[np.isfinite(y)]) if np.isfinite(y).sum() > 2 else 0.0
    late = float(np.mean(y[-w:]))
    if np.isfinite(late) and y[0] - late > max(1.5 * s * math.sqrt(1 + 1 / w), 1e-4 * abs(y[0])):
        return
    raise ValueError(
        f"diagnose: the model did not learn in its short run ({len(y)} steps under {recipe}: "
        f"training loss under a high-precision forward {y[0]:.4g} at the start, {late:.4g} "
        "over the last quarter, no fall beyond its batch-to-batch noise), so its GEMMs cannot "
        "be ranked; a learning rate or more steps that train it (--set lr=..., --set "
        "steps=...), then diagnose again"
    )


def quant_keys(seeds) -> list:
    """The quantization key of each quant seed (the trainer's phase-0 key of that seed)."""
    return [jax.random.fold_in(make_keys(quant=int(s))["quant"], 0) for s in seeds]
