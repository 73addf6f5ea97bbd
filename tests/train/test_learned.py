"""`learned`: a run learned when its training loss fell by more than its batch-to-batch noise
(`fp4lab.train.summary.learned`); a cell some of whose runs did not learn gets no verdict words.

Planted: a classifier of 10 classes on labels independent of the inputs (at chance, ln 10 at
every step), a learnable task at lr 1e-12 (random weights: its loss is noisy), and a slow
learner (lr 1e-3); the model at chance starts there (zero weights), as a conv net whose
learning rate leaves it there does."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import fp4lab as fl
from fp4lab import cli
from fp4lab.analysis import verdicts
from fp4lab.train.summary import MIN_LEARN_STEPS, learned

STEPS = 40
W = jnp.asarray(np.random.default_rng(7).normal(size=(8, 10)), jnp.float32)  # the teacher


def model(config, rngs):  # zero weights: every logit 0, the loss ln 10 (chance) at step 0
    return nnx.Linear(8, 10, kernel_init=nnx.initializers.zeros, rngs=rngs)


def drawn(config, rngs):  # random weights: a noisy loss above chance
    return nnx.Linear(8, 10, rngs=rngs)


def loss(model, batch):
    x, y = batch
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def at_chance(key, step):  # labels drawn apart from the inputs: nothing to learn
    kx, ky = jax.random.split(jax.random.fold_in(key, step))
    return jax.random.normal(kx, (64, 8)), jax.random.randint(ky, (64,), 0, 10)


def learnable(key, step):
    x = jax.random.normal(jax.random.fold_in(key, step), (64, 8))
    return x, jnp.argmax(x @ W, axis=-1)


def test_the_rule_on_planted_loss_curves():
    rng = np.random.default_rng(0)
    noise = rng.normal(scale=0.05, size=(200, 60))
    flat = math.log(10) + noise  # at chance
    slow = flat - np.linspace(0, 0.15, 60)  # falls 0.15 over the run: 3 batch SDs
    fast = flat + 2.0 * np.exp(-np.arange(60) / 3.0)
    # the figures docs/guide.md quotes (seeded, so exact)
    assert sum(learned(f) for f in flat) == 0  # 200 runs at chance: none learned
    assert sum(learned(f) for f in slow) == 193  # a fall of 3 batch SDs over the run
    assert sum(learned(f) for f in slow - np.linspace(0, 0.15, 60)) == 200  # 6 batch SDs
    assert sum(learned(f) for f in fast) == 200
    first_dip = flat[:, 1:].min(axis=1) < flat[:, 0]  # the old rule: below the first value
    assert first_dip.sum() == 199  # ... called 199 of the 200 runs at chance "learned"
    assert learned(np.full(60, 2.3)) == 0.0 and learned(np.linspace(2.3, 2.2, 60)) == 1.0
    assert learned(np.r_[slow[0, :20], np.nan, slow[0, 21:]]) == 0.0  # 20 finite steps, flat
    assert learned(np.r_[2.0, np.full(7, np.nan)]) == 0.0  # diverged at once
    assert math.isnan(learned(fast[0, : MIN_LEARN_STEPS - 1]))  # too short to tell


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    cfg = fl.Config(steps=STEPS, lr=1e-12, warmup=0, eval_batches=1, seed_batch=3)
    cells = {"fp32": {"recipe": "fp32"}, "bf16": {"recipe": "bf16"}}
    out = tmp_path_factory.mktemp("learned")
    runs = {}
    for name, net, batch, lr in (
        ("chance", model, at_chance, 0.1),
        ("tiny", drawn, learnable, 1e-12),
    ):
        cfg = cfg.replace(lr=lr)
        res = fl.own.sweep(net, loss, batch, cells, cfg, seeds=3, out=out / name, progress=False)
        runs[name] = res.runs
    slow = {"bf16": {"recipe": "bf16"}}
    res = fl.own.sweep(
        model,
        loss,
        learnable,
        slow,
        cfg.replace(lr=1e-3),
        seeds=3,
        out=out / "slow",
        progress=False,
    )
    runs["slow"] = res.runs
    return out, runs


def test_at_chance_and_at_lr_1e_12_every_run_did_not_learn_the_slow_learner_learned(planted):
    _, runs = planted
    for name in ("chance", "tiny"):
        assert len(runs[name]) == 6 and not runs[name]["learned"].astype(bool).any(), name
        m = fl.load(planted[0] / name).metrics
        loss = m[m["metric"] == "loss"].sort_values("step").groupby("run_id")["value"]
        assert loss.apply(lambda y: (y.to_numpy()[1:] < y.iloc[0]).any()).all()  # the old rule
    assert runs["slow"]["learned"].astype(bool).all()
    drop = runs["slow"]["final_train_loss"] - math.log(10)
    assert (drop < -0.02).all()  # slow: a small fall, yet above the noise


def test_no_verdict_words_for_runs_that_did_not_learn(planted, capsys):
    out, runs = planted
    for name in ("chance", "tiny"):
        table = verdicts.verdict(runs[name], "final_loss", draws=4000)
        assert set(table["verdict"]) == {"did not learn"}, table
        said = verdicts.words(runs[name], "final_loss", draws=4000)
        assert said.streams == [] and len(said.stuck) == 2
        why = "did not learn (3 of 3 runs: the training loss did not fall by more than its "
        why += "batch-to-batch noise)"
        assert said.cells == [f"fp32: not judged: fp32 {why}; bf16 {why}"]
        assert cli.main(["show", str(out / name)]) == 0
        text = capsys.readouterr().out
        assert "3 of 3 runs: the training loss did not fall by more than its" in text
        for word in ("no evidence", "matters", "higher", "lower", "undecided"):
            assert word not in text, (name, word)
        report = (out / f"{name}.html").as_posix()
        assert cli.main(["report", str(out / name), "--out", report]) == 0
        page = open(report).read()
        assert "did not learn" in page
        for word in (">no evidence<", ">matters<", ">higher<", ">lower<"):
            assert word not in page, (name, word)


def test_diagnose_says_a_model_at_chance_did_not_learn_and_stops():
    def wide(config, rngs):  # 16 wide: NVFP4's tiles fit
        return nnx.Linear(16, 16, kernel_init=nnx.initializers.zeros, rngs=rngs)

    def noise(key, step):
        kx, ky = jax.random.split(jax.random.fold_in(key, step))
        return jax.random.normal(kx, (64, 16)), jax.random.randint(ky, (64,), 0, 16)

    cfg = fl.Config(batch_size=64, steps=30, lr=0.1, warmup=0, eval_batches=1)
    with pytest.raises(ValueError, match=r"^diagnose: the model did not learn in its short run"):
        fl.diagnose(wide, loss, noise, config=cfg, checkpoints=(0, 30), batches=1, quant_seeds=1)
