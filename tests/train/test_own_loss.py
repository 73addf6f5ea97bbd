"""A loss of your own that returns a vector (per example) is named, with the fix, before a run
starts: jax's own error ("Gradient only defined for scalar-output functions") names neither."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import fp4lab as fl
from fp4lab.sweep import compute
from fp4lab.train.own import OwnTaskError


def model(config, rngs):
    return nnx.Linear(8, 8, rngs=rngs)


def per_example(model, batch):
    return jnp.mean((model(batch) - batch) ** 2, axis=-1)  # shape (4,): no mean over the batch


def batch(key, step):
    return jax.random.normal(key, (4, 8))


def test_a_vector_loss_is_named_with_its_fix():
    name = fl.own.task(model, per_example, batch)
    cfg = fl.Config(task="own", task_file=name, batch_size=4, steps=2, warmup=0, eval_batches=1)
    assert compute.check_cell(cfg) == (
        "OwnTaskError: loss(model, batch) returned an array of shape (4,); it must return a "
        "scalar (the batch's mean loss, e.g. jnp.mean(per_example))"
    )

    def mean(model, batch):
        return per_example(model, batch).mean()

    ok = cfg.replace(task_file=fl.own.task(model, mean, batch))
    assert compute.check_cell(ok) is None


def test_tokens_per_step_that_is_not_a_positive_whole_number_is_named():
    def mean(model, batch):
        return per_example(model, batch).mean()

    cfg = fl.Config(task="own", task_file=fl.own.task(model, mean, batch), batch_size=4, steps=2,
                    warmup=0, eval_batches=1, target_loss=1.0)  # fmt: skip
    for tokens in (-5, 2.5, 0):  # refused when the task is registered
        with pytest.raises(OwnTaskError, match=f"TOKENS_PER_STEP={tokens}; need a positive whole"):
            fl.own.task(model, mean, batch, tokens_per_step=tokens)
    name = fl.own.task(model, mean, batch, tokens_per_step=lambda c: "x")  # a function: per run
    assert compute.check_cell(cfg.replace(task_file=name)) == (
        "OwnTaskError: TOKENS_PER_STEP(config)='x'; need a positive whole number (the tokens or "
        "examples one step consumes)"
    )
    name = fl.own.task(model, mean, batch, tokens_per_step=lambda c: c.batch_size * 8)
    assert compute.check_cell(cfg.replace(task_file=name)) is None


def test_a_loss_that_returns_a_tuple_is_named():
    def with_aux(model, batch):
        return per_example(model, batch).mean(), 0.0

    cfg = fl.Config(task="own", task_file=fl.own.task(model, with_aux, batch), batch_size=4,
                    steps=2, warmup=0, eval_batches=1)  # fmt: skip
    assert compute.check_cell(cfg) == (
        "OwnTaskError: loss(model, batch) returned a tuple; it must return one scalar array "
        "(the batch's mean loss; metrics beside it are not taken)"
    )


def test_cells_that_are_not_a_dict_of_overrides_are_named(tmp_path):
    def mean(model, batch):
        return per_example(model, batch).mean()

    for cells in (["fp32"], {"a": "fp32"}, {1: {}}):
        with pytest.raises(ValueError, match=r"^cells=.*; give \{label: config overrides\}"):
            fl.own.sweep(model, mean, batch, cells, seeds=1, out=tmp_path / "x")


def test_a_batch_of_one_parameter_is_named_when_the_task_is_registered():
    def mean(model, batch):
        return per_example(model, batch).mean()

    with pytest.raises(OwnTaskError, match=r"batch\(key\) takes 1 positional parameter\(s\); "):
        fl.own.task(model, mean, lambda key: jax.random.normal(key, (4, 8)))
    fl.own.task(model, mean, lambda *args: jax.random.normal(args[0], (4, 8)))  # any number
