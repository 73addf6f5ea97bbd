"""A loss of your own that returns a vector (per example) is named, with the fix, before a run
starts: jax's own error ("Gradient only defined for scalar-output functions") names neither."""

import jax
import jax.numpy as jnp
from flax import nnx

import fp4lab as fl
from fp4lab.sweep import compute


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
