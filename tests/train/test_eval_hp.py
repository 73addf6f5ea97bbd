"""eval_hp: the held-out loss of the trained weights under a high-precision forward; loss_hp:
the same at every step, on the step's batch (`Config.target_on="hp"`)."""

import functools
import math

import jax
import numpy as np

from fp4lab.sweep import store
from fp4lab.train import summary, tasks, trainer
from fp4lab.train.config import Config

MLP = dict(task="teacher", din=32, dout=16, teacher_hidden=(32,), hidden=(32,), batch_size=16)


@functools.cache  # one compile and run per config, shared by the tests (read-only arrays)
def run(**kw) -> dict:
    cfg = Config(**(MLP | dict(steps=6, lr=1e-2, warmup=1, eval_batches=2) | kw))
    arrays = jax.jit(trainer.make_train(cfg))(trainer.make_keys(1, 2, 3))
    return cfg, jax.tree.map(_read_only, arrays)


def _read_only(a) -> np.ndarray:
    a = np.array(a)
    a.setflags(write=False)
    return a


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


# ---------------------------------------------------------------------------------------------
# loss_hp (Config.target_on="hp"): eval_hp at every step, on the step's fresh batch.


def test_loss_hp_is_the_plain_models_loss_on_the_steps_batch_before_the_update():
    keys = trainer.make_keys(1, 2, 3)
    cfg, out = run(recipe="nvfp4", target_on="hp")
    assert out["loss_hp"].shape == out["loss"].shape == (cfg.steps,)
    # step 0, computed apart from the trainer: the initial weights, unquantized, on batch 0
    task = tasks.make_task(cfg)
    want = task.loss(tasks.init_model(task, keys), tasks.train_batch(task, keys, 0))
    np.testing.assert_allclose(out["loss_hp"][0], float(want), rtol=1e-6)
    # NVFP4's forward measures the same weights a little differently at every step
    assert np.all(out["loss_hp"] != out["loss"])
    np.testing.assert_allclose(out["loss_hp"], out["loss"], rtol=0.05)
    # without quantization the two are one computation: the training loss of step t is the
    # step's weights on the step's batch before the update, so loss_hp is that too
    _, plain = run(recipe="fp32", target_on="hp")
    np.testing.assert_allclose(plain["loss_hp"], plain["loss"], rtol=1e-6)


def test_loss_hp_changes_no_number_of_the_run():
    _, off = run(recipe="nvfp4")
    _, on = run(recipe="nvfp4", target_on="hp")
    assert set(on) - set(off) == {"loss_hp"}
    for k in ("loss", "grad_norm", "eval_loss", "eval_hp"):
        assert on[k].tobytes() == off[k].tobytes(), k


def test_tokens_to_target_reads_loss_hp_when_asked():
    cfg, out = run(recipe="nvfp4", target_on="hp")  # the trainer reads no target: the run
    cfg = cfg.replace(target_loss=1.0, target_window=2)  # of the test above, summarized anew
    out = dict(out, loss=np.full(cfg.steps, 9.0, np.float32))  # the training loss never gets there
    out["loss_hp"] = np.array(
        [3.0, 2.0, 1.5, 0.5, 0.5, 0.5], np.float32
    )  # mean(1.5, 0.5) at step 3
    tokens = cfg.batch_size  # the teacher task: one example per row
    assert summary.summarize(cfg, out)["tokens_to_target"] == 4 * tokens
    train_cfg = cfg.replace(target_on="train")
    assert math.isnan(summary.summarize(train_cfg, out)["tokens_to_target"])


def test_target_on_train_keeps_the_run_ids_of_records_made_before_it():
    d = Config(**MLP).to_dict()
    assert d["target_on"] == "train"
    before = {k: v for k, v in d.items() if k != "target_on"}
    assert store.run_id(d, (0, 0, 0)) == store.run_id(before, (0, 0, 0))
    assert store.run_id(d | {"target_on": "hp"}, (0, 0, 0)) != store.run_id(d, (0, 0, 0))
    assert Config.from_dict(before) == Config(**MLP)
