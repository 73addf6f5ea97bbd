"""make_train(config) -> train(keys): one training run, pure, jit-able, vmap-able over seeds.

`keys` holds three independent PRNG streams (`make_keys`):

    init    the model's initial parameters
    data    the training batches (step t draws from fold_in(data, t)) and the held-out batches
    quant   stochastic rounding and random Hadamard signs (phase p: fold_in(quant, p))

so a sweep can vary one stream while holding the others fixed. Everything runs inside one
`lax.scan` per phase; seeds are a `jax.vmap` axis of `train`, and a seed's result does not depend
on which other seeds share its batch (tested bit for bit).

Precision phases (`Config.phases`) switch the recipe at a step: each phase is its own quantized
view of the same parameters and optimizer state. Telemetry (every `telemetry_every` steps) is one
step body for all steps: its statistics sit behind a `lax.cond` on `t % telemetry_every == 0`,
so the program holds the step once (what a cached program costs to load grows with its size)
and a step that does not measure runs none of their work; its GEMMs get the operands of a run
without telemetry, so the losses are bit-identical to one (tested). With the shadow
(`Config.shadow`), whose second, high-precision pass is not switched off per step, the measured
step is a body of its own and the steps between are plain ones; telemetry every step measures
inline, without the lax.cond; `Config.noise_keys` adds its K quantized backward passes
(`fp4lab.nnx.noise`) to the measured step only. Loss scaling multiplies the loss before
differentiation and divides the gradients after; the dynamic rule halves the scale and skips the
update on a non-finite gradient and doubles it after `growth_interval` finite steps. Divergence
(the first non-finite loss, or a loss above `spike_factor` times the first loss or times the
median of the last `spike_window` losses: `fp4lab.train.divergence`) is recorded, not raised;
with `stop_on_divergence` the run freezes there and later losses read NaN.

`train(keys)` returns arrays: loss, grad_norm and loss_scale per step (with `Config.signals`
also update_ratio and norm_max, `fp4lab.train.signals`, and the task's own signals, the LMs'
attn_logit_max and logit_z; and loss_hp with
`Config.target_on="hp"`: the step's weights on the step's batch, before the update, under a
high-precision forward: a held-out loss at every step where batches are fresh); eval_loss (held-out,
under the last phase's recipe, at the end) and eval_hp (the same weights and batches under a
high-precision forward: no quantization, so a change of recipe at evaluation is not mistaken
for a change of the weights); diverged_step (-1: never) and divergence_kind (0 none,
1 non-finite, 2 spike); telemetry {metric: values at `log_steps(config)`}.
`fp4lab.train.summary.summarize` turns one seed's arrays into the numbers of a results table.

The pieces: the tasks and what each stream feeds (`fp4lab.train.tasks`), loss scaling
(`fp4lab.train.loss_scaling`) and divergence detection (`fp4lab.train.divergence`) as pure
state-in / state-out functions, and here the step, the phases and the run.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from fp4lab.core import recipes
from fp4lab.core.spec import QuantSpec
from fp4lab.nnx import noise, telemetry
from fp4lab.nnx.rules import Rule, check_rules, quantize_model, unmatched_rules, warn_unseamed
from fp4lab.schema import OPERAND_NAMES, SEED_LIMIT, STREAMS
from fp4lab.train import divergence, loss_scaling, metric_rows, signals
from fp4lab.train.config import Config, ConfigError
from fp4lab.train.tasks import Task, eval_batch, init_model, make_task, train_batch

__all__ = [
    "make_keys",
    "make_optimizer",
    "make_train",
    "phase_rules",
    "check_config_rules",
    "log_steps",
    "Carry",
]


def make_keys(init: int = 0, data: int = 0, quant: int = 0) -> dict[str, jax.Array]:
    """The three streams from three integer seeds. Stream s of seed n is
    fold_in(key(n), index of s): equal integers in two streams still give independent keys.
    A seed lies in [0, 2**32) (`fp4lab.schema.SEED_LIMIT`): `jax.random.key` keeps its low 32
    bits, so one outside would repeat a stream inside; an int outside raises ValueError."""
    seeds = {"init": init, "data": data, "quant": quant}
    for s, n in seeds.items():
        if isinstance(n, int) and not 0 <= n < SEED_LIMIT:
            raise ValueError(f"make_keys: {s}={n} is outside [0, {SEED_LIMIT - 1}]")
    return {s: jax.random.fold_in(jax.random.key(seeds[s]), i) for i, s in enumerate(STREAMS)}


def make_optimizer(cfg: Config) -> optax.GradientTransformation:
    """Clipping (optional), then AdamW or SGD with momentum, under a warmup + decay schedule."""
    decay = max(cfg.steps - cfg.warmup, 1)
    end = cfg.lr * cfg.min_lr_ratio
    if cfg.schedule == "cosine":
        after = optax.cosine_decay_schedule(cfg.lr, decay, alpha=cfg.min_lr_ratio)
    elif cfg.schedule == "linear":
        after = optax.linear_schedule(cfg.lr, end, decay)
    else:
        after = optax.constant_schedule(cfg.lr)
    warm = optax.linear_schedule(0.0, cfg.lr, cfg.warmup) if cfg.warmup else None
    lr = optax.join_schedules([warm, after], [cfg.warmup]) if warm else after
    scales = cfg.lr_scales()
    if scales:  # phases that scale the learning rate from their start on
        lr = _scaled(lr, scales)
    if cfg.optimizer == "adamw":
        opt = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
    else:
        opt = optax.sgd(lr, momentum=cfg.momentum)
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), opt) if cfg.clip_norm else opt


def _scaled(schedule, scales: list[tuple[int, float]]):
    """`schedule` times the factor of the last phase start <= the step (1 before the first):
    before the first start the same value, bit for bit (x * 1.0 is x)."""
    starts = jnp.asarray([s for s, _ in scales], jnp.int32)
    factors = jnp.asarray([1.0] + [f for _, f in scales], jnp.float32)

    def lr(count):
        return schedule(count) * factors[jnp.sum(count >= starts)]

    return lr


def _recipe(value, gemms, backward: str) -> recipes.GemmRecipe:
    """The recipe of `Config.recipe` (a name or a GemmRecipe) with the overrides of
    `Config.gemms` and `Config.backward`, labelled for `describe` ("nvfp4+wgrad=bf16")."""
    recipe = recipes.override(recipes.get(value), gemms)
    label = value if isinstance(value, str) else recipe.name or "custom"
    for key, src in gemms:
        label += f"+{key}={src.summary() if isinstance(src, QuantSpec) else src}"
    if backward:
        recipe = recipe.replace(backward=backward)
        label += f"+{backward}"
    return dataclasses.replace(recipe, name=label)


def phase_rules(cfg: Config) -> list[tuple[int, int, list[Rule]]]:
    """[(start, stop, rules)] of every precision phase (`Config.precision`), the first
    starting at step 0; with `Config.pad`, every recipe zero-pads its operands."""
    bounds = cfg.precision()
    out = []
    for i, (start, s) in enumerate(bounds):
        stop = bounds[i + 1][0] if i + 1 < len(bounds) else cfg.steps
        rules = [Rule(p, _padded(cfg, r)) for p, r in s["rules"]]
        rules.append(Rule(".*", _padded(cfg, _recipe(s["recipe"], s["gemms"], s["backward"]))))
        out.append((start, stop, rules))
    return out


def _padded(cfg: Config, recipe):
    """`recipe` with every operand zero-padded to whole blocks where `Config.pad` asks."""
    if not cfg.pad or recipe is None:
        return recipe
    return recipes.get(recipe).replace(pad=True)


def check_config_rules(task: Task, phases: list[tuple[int, int, list[Rule]]]) -> list[str]:
    """A rule that would quantize nothing is a mistake, not a no-op: ConfigError.

    Each phase's rules (`phase_rules`) are matched against the task's model as
    `quantize_model` matches them (its shapes only, `nnx.eval_shape`, or the model itself where
    its constructor needs values; `fp4lab.nnx.rules.check_rules`); the phase's recipe for
    everything else (its last rule) may match nothing, unless no rule that quantizes reaches
    any layer (a model without a layer `quantize_model` can reach, or rules that keep every
    layer in high precision): its runs would hold high-precision numbers under a quantizing
    recipe's label. A model function that returns no nnx.Module is a ConfigError too. Modules
    that multiply their own parameters without a seam are warned about
    (`fp4lab.nnx.rules.warn_unseamed`) and returned (`train.no_seam` of `make_train`)."""

    def build():
        return task.model(nnx.Rngs(params=jax.random.key(0)))

    try:
        model = nnx.eval_shape(build)
    except Exception:  # a constructor that reads values: build it (its own errors surface)
        model = build()
    if not isinstance(model, nnx.Module):
        raise ConfigError(
            f"the task's model(config, rngs) returned a {type(model).__name__}; it must return "
            "the model itself, an nnx.Module (e.g. nnx.Linear(8, 8, rngs=rngs))"
        )
    for start, _, rules in phases:
        what = f"Config.phases (from step {start}) rules" if start else "Config.rules"
        quantizing = [r for r in rules if _quantizes(r.recipe)]
        # a recipe's label only for runs it quantizes: a model with no layer a quantizing
        # rule reaches (an own model without nnx.Linear, Einsum, Conv ...) is refused too
        unused = {id(r) for r in unmatched_rules(model, rules)}
        nothing = bool(quantizing) and all(id(r) in unused for r in quantizing)
        try:
            check_rules(model, rules, what=what, last_may_be_unused=not nothing)
        except ValueError as e:
            raise ConfigError(
                f"{e}; nothing of the model would be quantized" if nothing else str(e)
            ) from None
    # a module that multiplies its own Param without a seam stays unquantized: said once
    try:
        batch = jax.eval_shape(task.batch, jax.random.key(0), 0)
    except Exception:  # a batch that cannot be traced here fails in the run, with its error
        return []
    return warn_unseamed(model, [r for _, _, rules in phases for r in rules], task.loss, batch)


def _quantizes(recipe) -> bool:
    """Whether a rule's recipe quantizes (or casts) any GEMM operand."""
    recipe = recipes.get(recipe)
    return recipe is not None and any(getattr(recipe, f) is not None for f in OPERAND_NAMES)


def log_steps(cfg: Config) -> np.ndarray:
    """The steps at which telemetry is recorded."""
    if not cfg.telemetry_every:
        return np.zeros((0,), np.int64)
    return np.arange(0, cfg.steps, cfg.telemetry_every)


class Carry(NamedTuple):
    params: Any  # nnx.State of the Params
    opt_state: Any
    loss_scale: loss_scaling.LossScale
    divergence: divergence.Divergence


def _gradients(cfg: Config, task: Task, model, batch, scale, measure):
    """(loss, Param gradients of loss * scale, telemetry metrics); metrics are empty when
    `measure` is False, and hold the shadow's statistics too (shadow gradients and accumulated
    drift, `fp4lab.nnx.telemetry`) with `cfg.shadow`, and with `cfg.noise_keys` those of the
    noise draws (`fp4lab.nnx.noise`; its norms divided by the loss scale). `measure`: False,
    True, or a traced flag (measure where it holds, zero metrics elsewhere;
    `telemetry.value_and_grad`'s `when`)."""

    def scaled_loss(model, batch, scale):
        loss = task.loss(model, batch)
        return loss * scale, loss

    if measure is False:
        grad_fn = nnx.value_and_grad(scaled_loss, argnums=nnx.DiffState(0, nnx.Param), has_aux=True)
        (_, loss), grads = grad_fn(model, batch, scale)
        return loss, grads, {}
    when = None if measure is True else measure
    grad_fn = telemetry.value_and_grad(
        scaled_loss, has_aux=True, shadow=cfg.shadow, when=when, noise_keys=cfg.noise_keys
    )
    (_, loss), grads, metrics = grad_fn(model, batch, scale)
    if cfg.noise_keys and cfg.loss_scaling != "none":
        metrics = noise.unscale(metrics, scale)
    return loss, grads, metrics


def _step(
    cfg: Config, task: Task, tx, carry: Carry, t, graphdef, rest, keys, measure, hp=None, plain=None
):
    """One optimizer step: (carry, the model's non-Param state, per-step outputs, metrics).
    `hp`: (graphdef, non-Param state) of the plain model, whose loss on the step's batch with
    the step's weights, before the update, is the `loss_hp` output (`Config.target_on`)."""
    model = nnx.merge(graphdef, carry.params, rest)
    batch = train_batch(task, keys, t)
    scale = loss_scaling.scale_of(carry.loss_scale, cfg.loss_scaling)
    loss, grads, metrics = _gradients(cfg, task, model, batch, scale, measure)
    grads = loss_scaling.unscale(grads, carry.loss_scale, cfg.loss_scaling)
    new_rest = nnx.state(model, nnx.Not(nnx.Param))
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(grad_norm)
    updates, opt_state = tx.update(grads, carry.opt_state, carry.params)
    params = optax.apply_updates(carry.params, updates)
    div = divergence.update(carry.divergence, loss, t, cfg.spike_factor)

    keep = jnp.bool_(True)  # apply this update?
    if cfg.loss_scaling == "dynamic":
        keep = finite
    if cfg.stop_on_divergence:
        keep = keep & (div.step < 0)
    params = _select(keep, params, carry.params)
    opt_state = _select(keep, opt_state, carry.opt_state)
    ls = loss_scaling.adjust(carry.loss_scale, finite, cfg.loss_scaling, cfg.growth_interval)
    frozen = cfg.stop_on_divergence & (carry.divergence.step >= 0)
    nan = jnp.float32(jnp.nan)
    out = {
        "loss": jnp.where(frozen, nan, loss),
        "grad_norm": jnp.where(frozen, nan, grad_norm),
        "loss_scale": carry.loss_scale.scale,
    }
    if cfg.signals:
        out.update(signals.step_signals(model, carry.params, updates))
        if plain is not None:  # the task's own, on the high-precision model at these weights
            own = task.signals(nnx.merge(plain[0], carry.params, plain[1]), batch)
            out.update({k: jax.lax.stop_gradient(v).astype(jnp.float32) for k, v in own.items()})
        out = {k: jnp.where(frozen, nan, v) if k in signals.SIGNALS else v for k, v in out.items()}
    if hp is not None:
        loss_hp = task.loss(nnx.merge(hp[0], carry.params, hp[1]), batch)
        out["loss_hp"] = jnp.where(frozen, nan, jax.lax.stop_gradient(loss_hp))
    return Carry(params, opt_state, ls, div), new_rest, out, metrics


def _run_phase(
    cfg: Config, task: Task, step, carry: Carry, p: int, start, stop, rules, keys, report=None
):
    """Steps [start, stop) under `rules`: (carry, [per-step outputs], [telemetry]).

    `report(t, keys, out)`, when given, is called (traced) after every step with its outputs;
    `make_train` makes it a side effect every k steps that reads and changes nothing, and the
    scans of one step are then inlined as XLA inlines them without it (bit-identical, tested)."""
    every = cfg.telemetry_every
    if cfg.target_on == "hp" or (cfg.signals and task.signals is not None):
        graph_hp, _, rest_hp = nnx.split(init_model(task, keys), nnx.Param, ...)
        if cfg.target_on == "hp":  # the plain model, for loss_hp
            step = functools.partial(step, hp=(graph_hp, rest_hp))
        if cfg.signals and task.signals is not None:  # ... and for the task's signals
            step = functools.partial(step, plain=(graph_hp, rest_hp))
    model = init_model(task, keys)
    quantize_model(
        model,
        rules,
        key=jax.random.fold_in(keys["quant"], p),
        backend=cfg.backend,
        telemetry=cfg.telemetry_stats if every else False,
    )
    graph_off, _, rest = nnx.split(model, nnx.Param, ...)
    graph_on = None
    if every:
        graph_on = nnx.split(telemetry.set_enabled(model, True), nnx.Param, ...)[0]

    def plain(state, t):
        carry, rest = state
        carry, rest, out, _ = step(carry, t, graph_off, rest, keys, False)
        if report is not None:
            report(t, keys, out)
        return (carry, rest), out

    groups: dict = {}  # the measured step's metric names by dtype (`metric_rows.columns`)

    def measured(state, t):
        carry, rest = state
        carry, rest, out, metrics = step(carry, t, graph_on, rest, keys, True)
        if report is not None:
            report(t, keys, out)
        return (carry, rest), (out, metric_rows.columns(metrics, groups))

    def scan(body, state, ts):
        # XLA inlines a loop of one iteration, but not one with side effects (the report),
        # and the step then compiles differently (ulps in gradient norms, telemetry,
        # eval_hp); so with a report a one-step scan is called directly, and the program keeps
        # the numbers of the one without.
        if report is not None and len(ts) == 1:
            state, y = body(state, ts[0])
            return state, jax.tree.map(lambda a: a[None], y)
        return jax.lax.scan(body, state, ts)

    def chunk(state, t0):  # one measured step, then every - 1 plain ones
        state, (out0, metrics) = measured(state, t0)
        outs = jax.tree.map(lambda a: a[None], out0)
        if every > 1:
            state, rest_outs = scan(plain, state, t0 + jnp.arange(1, every))
            outs = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), outs, rest_outs)
        return state, (outs, metrics)

    state = (carry, rest)
    outs, metrics = [], []
    logs = [t for t in range(start, stop) if every and t % every == 0]
    if not logs:
        state, o = scan(plain, state, jnp.arange(start, stop))
        return state[0], [o], []
    if not cfg.shadow:
        return metric_rows.one_body(
            every, step, state, start, stop, logs, graph_on, keys, scan, report
        )
    first_log = -(-start // every) * every  # the first multiple of `every` >= start
    head = min(first_log, stop) - start
    if head:
        state, o = scan(plain, state, jnp.arange(start, start + head))
        outs.append(o)
    n_full = max(stop - first_log, 0) // every
    if n_full:
        t0s = first_log + every * jnp.arange(n_full)
        state, (o, m) = scan(chunk, state, t0s)
        outs.append(jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), o))
        metrics.append(m)
    tail_start = first_log + every * n_full
    if tail_start < stop:  # a partial last chunk
        state, (o0, m) = measured(state, jnp.int32(tail_start))
        outs.append(jax.tree.map(lambda a: a[None], o0))
        metrics.append(jax.tree.map(lambda a: a[None], m))
        if tail_start + 1 < stop:
            state, o = scan(plain, state, jnp.arange(tail_start + 1, stop))
            outs.append(o)
    return state[0], outs, [metric_rows.rows(metrics, groups)]


def _evaluate(cfg: Config, task: Task, params, rules, keys, p: int) -> jax.Array:
    """Mean held-out loss of `params` over `cfg.eval_batches` batches, under `rules`.

    `rules=None` evaluates the plain model: the high-precision forward (the model's compute
    dtype, `cfg.dtype`, without any quantization) of the same weights on the same batches.
    """
    model = init_model(task, keys)
    if rules is not None:
        quantize_model(model, rules, key=jax.random.fold_in(keys["quant"], p))
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)

    def one(state, i):  # the parameters ride in the carry: nnx.scan inside a scanned model
        params, rest = state  # needs its graph nodes made at this trace level
        m = nnx.merge(graphdef, params, rest)
        loss = task.loss(m, eval_batch(task, keys, i))
        return (params, nnx.state(m, nnx.Not(nnx.Param))), loss

    return jax.lax.scan(one, (params, rest), jnp.arange(cfg.eval_batches))[1].mean()


def make_train(
    config: Config, emit: Callable | None = None, every: int = 1
) -> Callable[[dict[str, jax.Array]], dict[str, Any]]:
    """A pure function keys -> run arrays for `config` (see the module docstring).

    Args:
      config: the run's configuration.
      emit: step reports, called traced `emit(done, run, out)` inside the compiled loop after
        every `every`-th step and after the last, behind a `lax.cond` on the (unbatched) step
        counter: `done` the steps done so far (int32), `run` the key data of the run's streams
        (uint32, `STREAMS` order; it tells the seeds of a vmapped call apart, one call per
        seed), `out` {loss, grad_norm, loss_scale} of that step. It must read values and
        return nothing (a side effect: `fp4lab.sweep.step_reports.report_step`, or a
        `jax.debug.callback`); scans of one step are then called directly (XLA inlines them
        only without a side effect), so every result (series, telemetry, evaluation) is
        bit-identical with and without it (tested on CPU).
      every: steps between two reports (>= 1).
    """
    cfg = config
    task = make_task(cfg)
    tx = make_optimizer(cfg)
    phases = phase_rules(cfg)
    no_seam = tuple(check_config_rules(task, phases))
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"make_train: every={every!r}; must be an int >= 1")
    report = None
    if emit is not None:

        def report(t, keys, out):
            def call():
                run = jnp.concatenate([jax.random.key_data(keys[s]).ravel() for s in STREAMS])
                emit(t + 1, run, out)

            due = ((t + 1) % every == 0) | (t + 1 == cfg.steps)
            jax.lax.cond(due, call, lambda: None)

    def step(carry, t, graphdef, rest, keys, measure, hp=None, plain=None):
        return _step(cfg, task, tx, carry, t, graphdef, rest, keys, measure, hp, plain)

    def train(keys: dict[str, jax.Array]) -> dict[str, Any]:
        missing = set(STREAMS) - set(keys)
        if missing:
            raise ValueError(f"train(keys): missing streams {sorted(missing)}; need {STREAMS}")
        params = nnx.state(init_model(task, keys), nnx.Param)
        carry = Carry(
            params=params,
            opt_state=tx.init(params),
            loss_scale=loss_scaling.init(cfg.loss_scale),
            divergence=divergence.init(cfg.spike_window),
        )
        outs, metrics = [], []
        for p, (start, stop, rules) in enumerate(phases):
            carry, o, m = _run_phase(cfg, task, step, carry, p, start, stop, rules, keys, report)
            outs += o
            metrics += m
        result = dict(jax.tree.map(lambda *a: jnp.concatenate(a), *outs))
        if cfg.eval_batches:
            result["eval_loss"] = _evaluate(
                cfg, task, carry.params, phases[-1][2], keys, len(phases)
            )
            result["eval_hp"] = _evaluate(cfg, task, carry.params, None, keys, len(phases))
        result["diverged_step"] = carry.divergence.step
        result["divergence_kind"] = carry.divergence.kind
        result["telemetry"] = (
            jax.tree.map(lambda *a: jnp.concatenate(a), *metrics) if metrics else {}
        )
        return result

    train.no_seam = no_seam  # the modules that stay in high precision for want of a seam
    return train


def _select(pred, a, b):
    return jax.tree.map(lambda x, y: jnp.where(pred, x, y), a, b)
