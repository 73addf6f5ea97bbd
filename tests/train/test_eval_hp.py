"""eval_hp: the held-out loss of the trained weights under a high-precision forward."""

import math

import jax
import numpy as np

from fp4lab.train import summary, trainer
from fp4lab.train.config import Config

MLP = dict(task="teacher", din=32, dout=16, teacher_hidden=(32,), hidden=(32,), batch_size=16)


def run(**kw) -> dict:
    cfg = Config(**(MLP | dict(steps=6, lr=1e-2, warmup=1, eval_batches=2) | kw))
    arrays = jax.jit(trainer.make_train(cfg))(trainer.make_keys(1, 2, 3))
    return cfg, jax.tree.map(np.asarray, arrays)


def test_eval_hp_equals_eval_loss_without_quantization():
    _, out = run(recipe="fp32")
    assert out["eval_hp"].tobytes() == out["eval_loss"].tobytes()


def test_eval_hp_measures_the_same_weights_without_the_quantized_forward():
    _, nvfp4 = run(recipe="nvfp4")
    hp, own = float(nvfp4["eval_hp"]), float(nvfp4["eval_loss"])
    assert math.isfinite(hp) and hp != own  # NVFP4's forward changes the measurement ...
    assert abs(hp - own) < 0.05 * own  # ... of the same weights, slightly
    # a late switch to fp32: the last phase is unquantized, so both measurements coincide
    _, switched = run(recipe="nvfp4", phases=((4, "fp32"),))
    assert switched["eval_hp"].tobytes() == switched["eval_loss"].tobytes()
    assert float(switched["eval_loss"]) != own


def test_summary_reports_both_measurements_and_names_the_recipe_one():
    cfg, out = run(recipe="nvfp4")
    row = summary.summarize(cfg, out)
    assert row["eval_hp"] == float(out["eval_hp"]) and row["measure"] == "recipe"
    assert row["loss_gap_hp"] == row["eval_hp"] - row["loss_floor"]
    assert row["final_loss"] == float(out["eval_loss"])  # the recipe's measurement, as before
    no_eval = {k: v for k, v in out.items() if k not in ("eval_loss", "eval_hp")}
    assert math.isnan(summary.summarize(cfg, no_eval)["eval_hp"])
