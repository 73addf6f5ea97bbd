"""The ground truth of a planted model: what each GEMM alone quantized does to training.

Each layer x GEMM is trained alone under the recipe (its gate on, every other GEMM in high
precision), besides all-FP4 and all-high-precision, from the same init on the same batches and
quant keys; the outcome is the held-out loss under a high-precision forward (all gates off)
after `steps` optimizer steps, as a share of the all-FP4 gap:

    truth(g) = mean_s (eval(g, s) - eval(hp, s)) / mean_s (eval(fp4, s) - eval(hp, s))

No score of stage 1 enters it: it is what the scores try to predict. One compiled program
trains every variant (the gates are data, vmapped).
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
from flax import nnx

import fp4lab as fl
from fp4lab.diagnosis import gate
from fp4lab.schema import GEMMS
from fp4lab.sweep.experiment import load_experiment
from fp4lab.train.tasks import eval_batch, init_model, make_task, train_batch
from fp4lab.train.trainer import make_keys, make_optimizer

PLANTED = Path(__file__).with_name("planted.py")


def config(plant: str, moved: bool = False, **changes) -> fl.Config:
    base = load_experiment(PLANTED).base
    return base.replace(task_args=(("plant", plant), ("moved", moved)), **changes)


def ground_truth(
    plant: str, *, seeds: int = 3, steps: int = 40, recipe="nvfp4", moved: bool = False
) -> pd.DataFrame:
    """One row per layer and GEMM: `truth` (module docstring) and its per-seed values."""
    cfg = config(plant, moved, steps=steps)
    task = make_task(cfg)
    tx = make_optimizer(cfg)
    per_seed, train = [], None
    for s in range(seeds):
        keys = make_keys(s, s, s)
        model = init_model(task, keys)
        fl.quantize_model(model, [fl.Rule(".*", recipe)], key=jax.random.fold_in(keys["quant"], 0))
        gate.gate_model(model)
        names = [(op.layer_paths[0], g) for op in gate.gated_ops(model) for g in GEMMS]
        k = len(names)
        rows = np.concatenate([np.zeros((1, k)), np.ones((1, k)), np.eye(k)]).astype(np.float32)
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        held_out = [eval_batch(task, keys, i) for i in range(cfg.eval_batches)]
        train = train or jax.jit(_trainer(graphdef, task, tx, steps))
        per_seed.append(np.asarray(train(params, rest, rows, keys, held_out)))
    evals = np.stack(per_seed)  # (seeds, variants)
    gap = (evals[:, 1] - evals[:, 0]).mean()
    truth = (evals[:, 2:] - evals[:, :1]).mean(0) / gap
    table = pd.DataFrame(names, columns=["layer", "gemm"]).assign(truth=truth, gap=gap)
    return table.sort_values("truth", ascending=False, kind="stable").reset_index(drop=True)


def _trainer(graphdef, task, tx, steps):
    """train(params, rest, rows, keys, held_out) -> (variants,) held-out loss, gates off."""

    def one(params, rest, row, keys, held_out):
        def step(carry, t):
            params, rest, opt = carry
            m = nnx.merge(graphdef, params, rest)
            gate.set_gates(m, row)
            grads = nnx.grad(task.loss, argnums=nnx.DiffState(0, nnx.Param))(
                m, train_batch(task, keys, t)
            )
            updates, opt = tx.update(grads, opt, params)
            return (
                optax.apply_updates(params, updates),
                nnx.state(m, nnx.Not(nnx.Param)),
                opt,
            ), None

        params_T = jax.lax.scan(step, (params, rest, tx.init(params)), jnp.arange(steps))[0][0]
        m = nnx.merge(graphdef, params_T, rest)
        gate.set_gates(m, jnp.zeros_like(row))
        return jnp.mean(jnp.stack([task.loss(m, b) for b in held_out]))

    return jax.vmap(one, in_axes=(None, None, 0, None, None))
