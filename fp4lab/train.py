"""make_train(config) -> train(keys): one training run, pure, jit-able, vmap-able over seeds.

`keys` holds three independent PRNG streams (`make_keys`):

    init    the model's initial parameters
    data    the training batches (step t draws from fold_in(data, t)) and the held-out batches
    quant   stochastic rounding and random Hadamard signs (phase p: fold_in(quant, p))

so a sweep can vary one stream while holding the others fixed. Everything runs inside one
`lax.scan` per phase; seeds are a `jax.vmap` axis of `train`, and a seed's result does not depend
on which other seeds share its batch (tested bit for bit).

Precision phases (`Config.phases`) switch the recipe at a step: each phase is its own quantized
view of the same parameters and optimizer state. Telemetry (every `telemetry_every` steps) runs a
second compiled step body that measures; the steps between cost what a run without telemetry
costs. Loss scaling multiplies the loss before differentiation and divides the gradients after;
the dynamic rule halves the scale and skips the update on a non-finite gradient and doubles it
after `growth_interval` finite steps. Divergence (the first non-finite loss, or a loss above
`spike_factor` times the median of the last `spike_window` losses) is recorded, not raised; with
`stop_on_divergence` the run freezes there and later losses read NaN.

`train(keys)` returns arrays: loss, grad_norm and loss_scale per step; eval_loss (held-out,
quantized forward, at the end); diverged_step (-1: never) and divergence_kind (0 none,
1 non-finite, 2 spike); telemetry {metric: values at `log_steps(config)`}. `summarize` turns
one seed's arrays into the numbers of a results table.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from fp4lab import recipes as R
from fp4lab import telemetry as T
from fp4lab.config import STREAMS, Config
from fp4lab.data import CharDataset, MarkovLM, Teacher
from fp4lab.inject import Rule, quantize_model
from fp4lab.models import MLP, Transformer, TransformerConfig

__all__ = [
    "Config",
    "Task",
    "make_task",
    "make_keys",
    "make_optimizer",
    "make_train",
    "init_model",
    "train_batch",
    "eval_batch",
    "phase_rules",
    "log_steps",
    "summarize",
    "DIVERGENCE_KINDS",
]

DIVERGENCE_KINDS = ("", "nonfinite", "spike")


# ---------------------------------------------------------------------------------------------
# Tasks with a known optimum.


@dataclasses.dataclass(frozen=True)
class Task:
    """A model, a batch sampler and a loss, with the loss's exact floor when known."""

    name: str
    floor: float  # the best achievable expected loss (NaN when unknown)
    tokens_per_step: int  # tokens (or examples) one optimizer step consumes
    model: Callable[[nnx.Rngs], nnx.Module]
    batch: Callable[[jax.Array], Any]  # data key -> batch
    loss: Callable[[nnx.Module, Any], jax.Array]  # (model, batch) -> mean loss


def _lm_task(cfg: Config, vocab: int, sample, floor: float, skip: int, name: str) -> Task:
    tcfg = TransformerConfig(
        vocab=vocab,
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        d_ff=cfg.d_ff,
        max_len=cfg.seq_len,
        dtype=cfg.dtype,
    )

    def loss(model, tokens_BxT):
        # predict tokens[skip:] from the full context before them, so the floor is exact
        logits_BxTxV = model(tokens_BxT[:, :-1])[:, skip - 1 :]
        labels_BxS = tokens_BxT[:, skip:]
        return optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, labels_BxS).mean()

    return Task(
        name=name,
        floor=floor,
        tokens_per_step=cfg.batch_size * cfg.seq_len,
        model=lambda rngs: Transformer(tcfg, rngs=rngs),
        batch=sample,
        loss=loss,
    )


def make_task(cfg: Config) -> Task:
    """The task of a config: the Markov language (floor: its entropy rate), teacher-student
    regression (floor 0) or a character-level text file (floor unknown)."""
    B, T1 = cfg.batch_size, cfg.seq_len + 1
    if cfg.task == "markov":
        lang = MarkovLM(
            vocab=cfg.vocab, order=cfg.order, branching=cfg.branching, seed=cfg.task_seed
        )
        lang = dataclasses.replace(lang, alpha=cfg.alpha) if cfg.alpha != 1.0 else lang
        sample = lambda key: lang.sample(key, B, T1)  # noqa: E731
        return _lm_task(cfg, cfg.vocab, sample, lang.entropy_rate, cfg.order, "markov")
    if cfg.task == "text":
        text = CharDataset.from_file(cfg.text_path)
        sample = lambda key: text.sample(key, B, T1)  # noqa: E731
        return _lm_task(cfg, text.vocab_size, sample, math.nan, 1, "text")
    teacher = Teacher(
        din=cfg.din,
        dout=cfg.dout,
        hidden=cfg.teacher_hidden,
        seed=cfg.task_seed,
        outlier_channels=tuple(range(cfg.outlier_channels)),
        outlier_scale=cfg.outlier_scale,
    )

    def loss(model, batch):
        x_BxI, y_BxO = batch
        return jnp.mean(jnp.square(model(x_BxI) - y_BxO))

    return Task(
        name="teacher",
        floor=0.0,
        tokens_per_step=B,
        model=lambda rngs: MLP(cfg.din, cfg.hidden, cfg.dout, rngs=rngs),
        batch=lambda key: teacher.sample(key, B),
        loss=loss,
    )


# ---------------------------------------------------------------------------------------------
# Keys, optimizer, precision.


def make_keys(init: int = 0, data: int = 0, quant: int = 0) -> dict[str, jax.Array]:
    """The three streams from three integer seeds. Stream s of seed n is
    fold_in(key(n), index of s): equal integers in two streams still give independent keys."""
    seeds = {"init": init, "data": data, "quant": quant}
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
    if cfg.optimizer == "adamw":
        opt = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
    else:
        opt = optax.sgd(lr, momentum=cfg.momentum)
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), opt) if cfg.clip_norm else opt


def _recipe(name: str, gemms, backward: str) -> R.GemmRecipe:
    recipe = R.get(name)
    label = name
    for gemm, src_name in gemms:
        src = R.get(src_name)
        recipe = recipe.replace(**{f"{gemm}_{o}": src.spec(gemm, o) for o in R.OPERANDS[gemm]})
        label += f"+{gemm}={src_name}"
    if backward:
        recipe = recipe.replace(backward=backward)
        label += f"+{backward}"
    return dataclasses.replace(recipe, name=label)


def phase_rules(cfg: Config) -> list[tuple[int, int, list[Rule]]]:
    """[(start, stop, rules)] of every precision phase, the first starting at step 0."""
    state = {"recipe": cfg.recipe, "gemms": cfg.gemms, "backward": cfg.backward}
    state["rules"] = cfg.rules
    bounds = [(0, dict(state))]
    for start, change in cfg.phases:
        change = dict(change)
        if set(change) == {"recipe"}:  # a bare recipe name: the whole model switches
            state = {"recipe": change["recipe"], "gemms": (), "backward": "", "rules": ()}
        else:
            state = state | change
        bounds.append((cfg.phase_start(start), dict(state)))
    out = []
    for i, (start, s) in enumerate(bounds):
        stop = bounds[i + 1][0] if i + 1 < len(bounds) else cfg.steps
        rules = [Rule(p, r) for p, r in s["rules"]]
        rules.append(Rule(".*", _recipe(s["recipe"], s["gemms"], s["backward"])))
        out.append((start, stop, rules))
    return out


def log_steps(cfg: Config) -> np.ndarray:
    """The steps at which telemetry is recorded."""
    if not cfg.telemetry_every:
        return np.zeros((0,), np.int64)
    return np.arange(0, cfg.steps, cfg.telemetry_every)


# ---------------------------------------------------------------------------------------------
# Streams: what each key feeds.


def init_model(task: Task, keys) -> nnx.Module:
    """The model at its initial parameters: the `init` stream only."""
    return task.model(nnx.Rngs(params=keys["init"]))


def train_batch(task: Task, keys, t) -> Any:
    """The batch of step t: the `data` stream only."""
    return task.batch(jax.random.fold_in(jax.random.split(keys["data"])[0], t))


def eval_batch(task: Task, keys, i) -> Any:
    """Held-out batch i (disjoint from the training draws): the `data` stream only."""
    return task.batch(jax.random.fold_in(jax.random.split(keys["data"])[1], i))


# ---------------------------------------------------------------------------------------------
# The trainer.


class Carry(NamedTuple):
    params: Any  # nnx.State of the Params
    opt_state: Any
    scale: jax.Array  # loss scale
    good: jax.Array  # finite steps since the scale last changed
    window: jax.Array  # the last spike_window losses (NaN: not yet)
    diverged_step: jax.Array  # int32, -1 = not diverged
    kind: jax.Array  # int32 index into DIVERGENCE_KINDS


def make_train(config: Config) -> Callable[[dict[str, jax.Array]], dict[str, Any]]:
    """A pure function keys -> run arrays for `config` (see the module docstring)."""
    cfg = config
    task = make_task(cfg)
    tx = make_optimizer(cfg)
    phases = phase_rules(cfg)
    every = cfg.telemetry_every
    dynamic = cfg.loss_scaling == "dynamic"
    scaled = cfg.loss_scaling != "none"

    def scaled_loss(model, batch, scale):
        loss = task.loss(model, batch)
        return loss * scale, loss

    def step(carry: Carry, t, graphdef, rest, keys, measure: bool):
        model = nnx.merge(graphdef, carry.params, rest)
        batch = train_batch(task, keys, t)
        scale = carry.scale if scaled else jnp.float32(1.0)
        metrics = {}
        if measure:
            (_, loss), grads, metrics = T.value_and_grad(scaled_loss, has_aux=True)(
                model, batch, scale
            )
        else:
            grad_fn = nnx.value_and_grad(
                scaled_loss, argnums=nnx.DiffState(0, nnx.Param), has_aux=True
            )
            (_, loss), grads = grad_fn(model, batch, scale)
        grads = jax.tree.map(lambda g: g / scale, grads) if scaled else grads
        if measure and cfg.shadow:
            exact = T.exact_grads(lambda m, b: task.loss(m, b), model, batch)
            metrics |= T.shadow_metrics(grads, exact)
        new_rest = nnx.state(model, nnx.Not(nnx.Param))
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(grad_norm)
        updates, opt_state = tx.update(grads, carry.opt_state, carry.params)
        params = optax.apply_updates(carry.params, updates)

        # divergence: the first non-finite loss, or a spike over the running median
        full = jnp.all(jnp.isfinite(carry.window))
        median = jnp.median(carry.window)
        spike = full & (loss > cfg.spike_factor * median)
        bad = ~jnp.isfinite(loss)
        new_kind = jnp.where(bad, 1, jnp.where(spike, 2, 0)).astype(jnp.int32)
        first = (carry.diverged_step < 0) & (new_kind > 0)
        diverged_step = jnp.where(first, t.astype(jnp.int32), carry.diverged_step)
        kind = jnp.where(first, new_kind, carry.kind)
        window = jnp.roll(carry.window, -1).at[-1].set(loss)

        keep = jnp.bool_(True)  # apply this update?
        if dynamic:
            keep = finite
        if cfg.stop_on_divergence:
            keep = keep & (diverged_step < 0)
        params = _select(keep, params, carry.params)
        opt_state = _select(keep, opt_state, carry.opt_state)
        scale, good = carry.scale, carry.good
        if dynamic:
            good = jnp.where(finite, good + 1, 0)
            grow = good >= cfg.growth_interval
            scale = jnp.where(finite, jnp.where(grow, scale * 2, scale), jnp.maximum(scale / 2, 1))
            good = jnp.where(grow, 0, good)
        frozen = cfg.stop_on_divergence & (carry.diverged_step >= 0)
        nan = jnp.float32(jnp.nan)
        out = {
            "loss": jnp.where(frozen, nan, loss),
            "grad_norm": jnp.where(frozen, nan, grad_norm),
            "loss_scale": carry.scale,
        }
        new = Carry(params, opt_state, scale, good, window, diverged_step, kind)
        return new, new_rest, out, metrics

    def run_phase(carry, p, start, stop, rules, keys):
        model = init_model(task, keys)
        quantize_model(
            model,
            rules,
            key=jax.random.fold_in(keys["quant"], p),
            backend=cfg.backend,
            telemetry=bool(every),
        )
        graph_off, _, rest = nnx.split(model, nnx.Param, ...)
        graph_on = None
        if every:
            graph_on = nnx.split(T.set_enabled(model, True), nnx.Param, ...)[0]

        def plain(state, t):
            carry, rest = state
            carry, rest, out, _ = step(carry, t, graph_off, rest, keys, False)
            return (carry, rest), out

        def measured(state, t):
            carry, rest = state
            carry, rest, out, metrics = step(carry, t, graph_on, rest, keys, True)
            return (carry, rest), (out, metrics)

        def chunk(state, t0):  # one measured step, then every - 1 plain ones
            state, (out0, metrics) = measured(state, t0)
            outs = jax.tree.map(lambda a: a[None], out0)
            if every > 1:
                state, rest_outs = jax.lax.scan(plain, state, t0 + jnp.arange(1, every))
                outs = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), outs, rest_outs)
            return state, (outs, metrics)

        state = (carry, rest)
        outs, metrics = [], []
        if not every:
            state, o = jax.lax.scan(plain, state, jnp.arange(start, stop))
            return state[0], [o], []
        first_log = -(-start // every) * every  # the first multiple of `every` >= start
        head = min(first_log, stop) - start
        if head:
            state, o = jax.lax.scan(plain, state, jnp.arange(start, start + head))
            outs.append(o)
        n_full = max(stop - first_log, 0) // every
        if n_full:
            t0s = first_log + every * jnp.arange(n_full)
            state, (o, m) = jax.lax.scan(chunk, state, t0s)
            outs.append(jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), o))
            metrics.append(m)
        tail_start = first_log + every * n_full
        if tail_start < stop:  # a partial last chunk
            state, (o0, m) = measured(state, jnp.int32(tail_start))
            outs.append(jax.tree.map(lambda a: a[None], o0))
            metrics.append(jax.tree.map(lambda a: a[None], m))
            if tail_start + 1 < stop:
                state, o = jax.lax.scan(plain, state, jnp.arange(tail_start + 1, stop))
                outs.append(o)
        return state[0], outs, metrics

    def evaluate(params, rules, keys):
        model = init_model(task, keys)
        quantize_model(model, rules, key=jax.random.fold_in(keys["quant"], len(phases)))
        graphdef, _, rest = nnx.split(model, nnx.Param, ...)

        def one(rest, i):
            m = nnx.merge(graphdef, params, rest)
            loss = task.loss(m, eval_batch(task, keys, i))
            return nnx.state(m, nnx.Not(nnx.Param)), loss

        return jax.lax.scan(one, rest, jnp.arange(cfg.eval_batches))[1].mean()

    def train(keys: dict[str, jax.Array]) -> dict[str, Any]:
        missing = set(STREAMS) - set(keys)
        if missing:
            raise ValueError(f"train(keys): missing streams {sorted(missing)}; need {STREAMS}")
        params = nnx.state(init_model(task, keys), nnx.Param)
        carry = Carry(
            params=params,
            opt_state=tx.init(params),
            scale=jnp.float32(cfg.loss_scale),
            good=jnp.int32(0),
            window=jnp.full((cfg.spike_window,), jnp.nan, jnp.float32),
            diverged_step=jnp.int32(-1),
            kind=jnp.int32(0),
        )
        outs, metrics = [], []
        for p, (start, stop, rules) in enumerate(phases):
            carry, o, m = run_phase(carry, p, start, stop, rules, keys)
            outs += o
            metrics += m
        per_step = jax.tree.map(lambda *a: jnp.concatenate(a), *outs)
        result = dict(per_step)
        if cfg.eval_batches:
            result["eval_loss"] = evaluate(carry.params, phases[-1][2], keys)
        result["diverged_step"] = carry.diverged_step
        result["divergence_kind"] = carry.kind
        result["telemetry"] = (
            jax.tree.map(lambda *a: jnp.concatenate(a), *metrics) if metrics else {}
        )
        return result

    return train


def _select(pred, a, b):
    return jax.tree.map(lambda x, y: jnp.where(pred, x, y), a, b)


# ---------------------------------------------------------------------------------------------
# Summaries (host side).


def target_of(cfg: Config, floor: float) -> float:
    """The tokens-to-target threshold: target_loss, or floor + target_gap, or NaN (none)."""
    if cfg.target_loss is not None:
        return cfg.target_loss
    if cfg.target_gap is not None:
        return floor + cfg.target_gap
    return math.nan


def tokens_to_target(loss: np.ndarray, target: float, window: int, tokens_per_step: int) -> float:
    """Tokens consumed when the mean of the last `window` train losses first reaches `target`
    (NaN: never, or no target). Steps with a NaN loss never count as reached."""
    loss = np.asarray(loss, np.float64)
    if not math.isfinite(target) or len(loss) < window:
        return math.nan
    smooth = np.convolve(loss, np.ones(window) / window, mode="valid")  # smooth[i]: steps i..i+w-1
    hit = np.flatnonzero(smooth <= target)
    return math.nan if not len(hit) else float((hit[0] + window) * tokens_per_step)


def summarize(cfg: Config, arrays: dict[str, Any], task: Task | None = None) -> dict[str, Any]:
    """One seed's arrays -> the summary numbers of its row in the runs table."""
    task = task or make_task(cfg)
    loss = np.asarray(arrays["loss"], np.float64)
    tail = loss[-max(len(loss) // 10, 1) :]
    final = float(np.asarray(arrays["eval_loss"])) if "eval_loss" in arrays else np.mean(tail)
    target = target_of(cfg, task.floor)
    div_step = int(np.asarray(arrays["diverged_step"]))
    return {
        "final_loss": float(final),
        "final_train_loss": float(np.mean(tail)),
        "eval_loss": float(np.asarray(arrays["eval_loss"])) if "eval_loss" in arrays else math.nan,
        "loss_floor": task.floor,
        "loss_gap": final - task.floor,
        "diverged": div_step >= 0,
        "divergence_step": float(div_step) if div_step >= 0 else math.nan,
        "divergence_kind": DIVERGENCE_KINDS[int(np.asarray(arrays["divergence_kind"]))],
        "target_loss": target,
        "tokens_to_target": tokens_to_target(loss, target, cfg.target_window, task.tokens_per_step),
        "tokens_per_step": task.tokens_per_step,
    }
