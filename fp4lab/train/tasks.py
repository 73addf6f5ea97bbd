"""Tasks with a known optimum, and what each seed stream feeds.

    markov    the Llama-style Transformer on a synthetic Markov language (floor: its entropy rate)
    proxy     Su et al.'s instability proxy: a pre-LayerNorm residual MLP regressing a fixed
              random GELU teacher on Gaussian inputs (floor 0)
    text      the same model on a character-level text file (floor unknown)
    teacher   an MLP regressing a fixed random teacher network (floor 0)
    own       your model, loss and data (`fp4lab.train.own`; floor: the file's FLOOR or unknown)

`init_model` uses the `init` stream only; `train_batch` and `eval_batch` the `data` stream only
(disjoint draws), so a sweep can vary one stream while holding the others fixed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from fp4lab.data import CharDataset, MarkovLM, Teacher
from fp4lab.models import MLP, ResidualMLP, Transformer, TransformerConfig
from fp4lab.models.transformer import logit_stats
from fp4lab.train import own
from fp4lab.train.config import Config

__all__ = ["Task", "make_task", "init_model", "train_batch", "eval_batch"]


@dataclasses.dataclass(frozen=True)
class Task:
    """A model, a batch sampler and a loss, with the loss's exact floor when known."""

    name: str
    floor: float  # the best achievable expected loss (NaN when unknown)
    tokens_per_step: int  # tokens (or examples) one optimizer step consumes
    model: Callable[[nnx.Rngs], nnx.Module]
    batch: Callable[[jax.Array, Any], Any]  # (data key, step) -> batch
    loss: Callable[[nnx.Module, Any], jax.Array]  # (model, batch) -> mean loss
    eval: Callable[[jax.Array, Any], Any] | None = None  # (key, i) -> held-out batch (or batch)
    # (model, batch) -> {signal: scalar}: the task's own per-step signals (`Config.signals`),
    # read from the high-precision model at the step's weights (the built-in LMs': the
    # largest attention logit and the RMS of the output logits' log Z)
    signals: Callable[[nnx.Module, Any], dict[str, jax.Array]] | None = None


def _lm_task(cfg: Config, vocab: int, sample, floor: float, skip: int, name: str) -> Task:
    tcfg = TransformerConfig(
        vocab=vocab,
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        d_ff=cfg.d_ff,
        max_len=cfg.seq_len,
        dtype=cfg.dtype,
        scan_layers=cfg.scan_layers,
        qk_norm=cfg.qk_norm,
    )

    def loss(model, tokens_BxT):
        # predict tokens[skip:] from the full context before them, so the floor is exact
        logits_BxTxV = model(tokens_BxT[:, :-1])[:, skip - 1 :]
        labels_BxS = tokens_BxT[:, skip:]
        ce = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, labels_BxS).mean()
        if not cfg.z_loss:
            return ce
        # z-loss (PaLM; Wortsman et al. 2023): keeps log Z of the output logits near 0
        z_BxS = jax.nn.logsumexp(logits_BxTxV, axis=-1)
        return ce + cfg.z_loss * jnp.mean(jnp.square(z_BxS))

    def signals(model, tokens_BxT):
        # Wortsman et al. 2023's two instabilities: attention-logit growth, output-logit drift
        logits_BxTxV, maxima_L = logit_stats(model, tokens_BxT[:, :-1])
        z_BxS = jax.nn.logsumexp(logits_BxTxV[:, skip - 1 :], axis=-1)
        return {"attn_logit_max": jnp.max(maxima_L), "logit_z": jnp.sqrt(jnp.mean(z_BxS**2))}

    return Task(
        name=name,
        floor=floor,
        tokens_per_step=cfg.batch_size * cfg.seq_len,
        model=lambda rngs: Transformer(tcfg, rngs=rngs),
        batch=lambda key, t: sample(key),
        loss=loss,
        signals=signals,
    )


def make_task(cfg: Config) -> Task:
    """The task of a config: the Markov language (floor: its entropy rate), teacher-student
    regression (floor 0) or a character-level text file (floor unknown)."""
    B, T1 = cfg.batch_size, cfg.seq_len + 1
    if cfg.task == "own":
        return _own_task(cfg)
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
    if cfg.task == "proxy":
        return _proxy_task(cfg)
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
        batch=lambda key, t: teacher.sample(key, B),
        loss=loss,
    )


def _proxy_task(cfg: Config) -> Task:
    """Su et al. 2025's proxy (arXiv 2506.20752): the pre-LayerNorm residual MLP
    (`fp4lab.models.ResidualMLP`: d_model wide, n_layers blocks, d_ff hidden, `activation`)
    regressing a fixed random GELU teacher (din -> teacher_hidden -> dout, `task_seed`) on
    Gaussian inputs; mean squared error, floor 0."""
    teacher = Teacher(
        din=cfg.din,
        dout=cfg.dout,
        hidden=cfg.teacher_hidden,
        seed=cfg.task_seed,
        activation="gelu",
        outlier_channels=tuple(range(cfg.outlier_channels)),
        outlier_scale=cfg.outlier_scale,
    )

    def loss(model, batch):
        x_BxI, y_BxO = batch
        return jnp.mean(jnp.square(model(x_BxI) - y_BxO))

    def model(rngs):
        return ResidualMLP(
            cfg.din, cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.dout, cfg.activation, rngs=rngs
        )

    return Task(
        name="proxy",
        floor=0.0,
        tokens_per_step=cfg.batch_size,
        model=model,
        batch=lambda key, t: teacher.sample(key, cfg.batch_size),
        loss=loss,
    )


def _own_task(cfg: Config) -> Task:
    """The task of an experiment file's (or registered) model, loss and batch functions."""
    ns = own.namespace(cfg.task_file)

    def with_config(fn):
        return (lambda key, t: fn(cfg, key, t)) if own.takes_config(fn) else fn

    eval_fn = getattr(ns, "eval_batch", None)
    return Task(
        name="own",
        floor=own.floor_of(ns),
        tokens_per_step=own.tokens_per_step(ns, cfg),
        model=lambda rngs: ns.model(cfg, rngs),
        batch=with_config(ns.batch),
        loss=_scalar(ns.loss),
        eval=with_config(eval_fn) if eval_fn is not None else None,
    )


@functools.cache  # one wrapper per loss: what is traced once per loss stays so
def _scalar(loss: Callable) -> Callable:
    """The task's loss, checked where it is traced: a loss of any other shape than a scalar
    is an OwnTaskError that names `loss` and the fix (jax's own error names neither)."""

    def checked(model, batch):
        value = loss(model, batch)
        if not isinstance(value, jax.Array | np.ndarray | np.generic | float | int):
            raise own.OwnTaskError(
                f"loss(model, batch) returned a {type(value).__name__}; it must return one "
                "scalar array (the batch's mean loss; metrics beside it are not taken)"
            )
        shape = jnp.shape(value)
        if shape != ():
            raise own.OwnTaskError(
                f"loss(model, batch) returned an array of shape {shape}; it must return a scalar "
                "(the batch's mean loss, e.g. jnp.mean(per_example))"
            )
        return value

    return checked


def init_model(task: Task, keys) -> nnx.Module:
    """The model at its initial parameters: the `init` stream only."""
    return task.model(nnx.Rngs(params=keys["init"]))


def train_batch(task: Task, keys, t) -> Any:
    """The batch of step t: the `data` stream only."""
    return task.batch(jax.random.fold_in(jax.random.split(keys["data"])[0], t), t)


def eval_batch(task: Task, keys, i) -> Any:
    """Held-out batch i (disjoint from the training draws): the `data` stream only."""
    key = jax.random.fold_in(jax.random.split(keys["data"])[1], i)
    return (task.eval or task.batch)(key, i)
