"""A tiny version of each instability study runs end to end: the experiment file as committed,
its every cell trained for real at a tiny size (one seed, or the streams study's crossed pairs;
the recipes-against-lr study's and the LM's at one learning rate), then its own
`analyze`, whose tables have a row per cell, contrast or fork. The forks study runs
on a planted parent (a model whose loss jumps 100x at step 25), since a tiny proxy does not spike.

Slow to compile (a program per cell), so the cells are as small as the recipes allow: every
GEMM dimension a multiple of the 32-blocks of MXFP4.
"""

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import fp4lab as fl
from fp4lab import sweep
from fp4lab.sweep import runner
from fp4lab.train.config import Config

ROOT = Path(__file__).resolve().parents[2]
PROXY = dict(din=32, dout=32, teacher_hidden=(32,), d_model=32, d_ff=32, n_layers=1, batch_size=32)
PROXY |= dict(steps=120, warmup=2, eval_batches=1)  # damping's analyze reads steps 100-800
LM = dict(vocab=32, d_model=32, n_layers=1, n_heads=1, d_ff=32, seq_len=8, batch_size=4)
LM |= dict(steps=12, warmup=2, eval_batches=1)
# study -> (overrides, seeds, {table: rows})
STUDIES = {
    "instability_proxy": (PROXY, 1, {"rates": 10, "contrasts": 14, "predict": 3}),
    "instability_proxy_key": (PROXY, 1, {"rates": 3, "contrasts": 2}),
    "instability_forks_fresh_parents": (PROXY, 1, {"rates": 4, "contrasts": 3}),
    "instability_fp8_seeds": (PROXY, 1, {"rates": 4, "contrasts": 4}),
    "instability_sr_seeds": (PROXY, 1, {"rates": 2, "contrasts": 1, "loss": 2}),
    "instability_damping": (PROXY, 1, {"rates": 5, "contrasts": 4}),
    # its cells with the outputs quantized (the reference cells are the proxy study's)
    "instability_outputs": (PROXY, 1, {"rates": 4, "contrasts": 2}),
    "instability_streams": (PROXY, [(0, 0, 0), (0, 0, 1), (1, 1, 0), (1, 1, 1)], {"rates": 1}),
    # with the proxy study's lr-0.1 cells (the committed ones): 3 learning rates
    "instability_proxy_lr": (PROXY, 1, {"rates": 12, "lr_loss": 12, "sensitivity": 4}),
    "instability_lm": (LM, 1, {"rates": 4, "lr_loss": 4, "sensitivity": 4}),
    # one cell (the LM's signals, their growth and prediction, have their own tests)
    "instability_lm_signals": (LM, 1, {"rates": 1, "growth": 4, "predict": 4}),
    # its cells at lr 0.3 (every precision once), joined with 8 committed (precision, lr) cells
    "instability_recipes_lr": (PROXY, 1, {"rates": 15, "lr_loss": 15, "sensitivity": 9}),
}
# studies of more cells than a test compiles: the cells whose label ends so (or in one of these)
ONLY = {
    "instability_recipes_lr": " lr 0.3",
    "instability_lm": " lr 1.0",
    "instability_lm_signals": "mxfp4 z-loss lr 1.0",
    "instability_outputs": "out",
    "instability_sr_seeds": ("mxfp4", "mxfp4-sr"),
}


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_a_tiny_version_of_the_study_trains_every_cell_and_analyzes(study, tmp_path):
    overrides, seeds, rows = STUDIES[study]
    path = ROOT / "experiments" / f"{study}.py"
    experiment = sweep.load_experiment(path, seeds=seeds, overrides=overrides)
    if study in ONLY:
        cells = tuple(c for c in experiment.cells if c.label.endswith(ONLY[study]))
        experiment = dataclasses.replace(experiment, cells=cells)
    counts = runner.run_experiment(experiment, tmp_path / study, progress=False)
    assert counts["failed"] == 0
    results = fl.load(tmp_path / study)
    assert len(results.runs) == sum(len(c.seeds) for c in experiment.cells)
    spiked = results.runs["spikes"] > 0  # first_spike and max_spike: NaN where none
    assert results.runs["diverged_at_end"].notna().all()
    assert (results.runs["first_spike"].notna() == spiked).all()
    tables = experiment.analyze(results)
    assert {name: len(tables[name]) for name in rows} == rows


EVENT = 25


def _model(config, rngs):
    return nnx.Sequential(
        nnx.Linear(32, 32, rngs=rngs), nnx.LayerNorm(32, rngs=rngs), nnx.Linear(32, 32, rngs=rngs)
    )


def _batch(key, step):
    return jax.random.normal(key, (32, 32)), step


def _loss(model, batch):
    x, step = batch
    return jnp.mean(jnp.square(model(x) - 1.0)) * jnp.where(step == EVENT, 100.0, 1.0)


def test_a_tiny_version_of_the_forks_study_forks_a_planted_parent(tmp_path):
    parent = tmp_path / "results" / "instability_proxy"
    base = Config(steps=60, lr=0.01, clip_norm=0.0, warmup=0, schedule="constant", eval_batches=1)
    cells = {"bf16+ln": {"recipe": "bf16", "gemms": {"norms": fl.mxfp4()}}}
    fl.own.sweep(_model, _loss, _batch, cells, base, seeds=2, out=parent, progress=False)
    text = (ROOT / "experiments" / "instability_forks.py").read_text()
    committed = 'PARENT = Path(__file__).resolve().parents[1] / "results" / "instability_proxy"'
    assert committed in text and "\nBEFORE = 50\n" in text
    text = text.replace(committed, f"PARENT = Path({str(parent)!r})")
    path = tmp_path / "instability_forks.py"
    path.write_text(text.replace("\nBEFORE = 50\n", "\nBEFORE = 5\n"))
    experiment = sweep.load_experiment(path)
    # both parent runs spike at step 25: each change's two forks are one config, one cell
    assert [len(cell.seeds) for cell in experiment.cells] == [2, 2, 2]
    counts = runner.run_experiment(experiment, tmp_path / "forks", progress=False)
    assert counts["failed"] == 0
    tables = experiment.analyze(fl.load(tmp_path / "forks"))
    forks = tables["forks"]
    assert len(forks) == 6 and set(forks["fork_step"]) == {EVENT - 5}
    ids = fl.load(parent, metrics=False).runs["run_id"]
    assert forks["parent"].value_counts().to_dict() == dict.fromkeys(ids, 3)  # by their seeds
    # the planted jump is in the loss, not the model: every fork meets it at step 25
    assert set(forks["fork_first"]) == {EVENT}
    assert set(tables["averted"]["change"]) == {"norms hp", "gemms mxfp4", "lr/2"}
    assert (tmp_path / "forks" / "figures" / "forks.png").is_file()
