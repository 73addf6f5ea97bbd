"""Shared pieces of the reliability tests: a tiny experiment file and a compute without jax."""

import textwrap

import numpy as np
import pytest

from fp4lab import sweep

EXPERIMENT = """
from fp4lab.train.config import Config

SEEDS = 2

def get_config():
    return Config(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,),
                  batch_size=32, steps={steps}, eval_batches=1, seed_batch=2)

def sweep(add):
{body}
"""


def fake_compute(config, seeds):
    """Plain data shaped like compute_cell's, from the config and seeds (no jax, instant)."""
    out = []
    for s in seeds:
        loss = float(config["lr"] * 100 + config["steps"] + sum(s) / 10)
        summary = {"final_loss": loss, "final_train_loss": loss, "eval_loss": loss}
        summary |= {"loss_floor": 0.0, "loss_gap": loss, "diverged": False}
        summary |= {"divergence_step": float("nan"), "divergence_kind": "none"}
        summary |= {"target_loss": float("nan"), "tokens_to_target": float("nan")}
        summary |= {"tokens_per_step": 32, "eval_hp": loss}
        series = {"loss": np.full(config["steps"], loss, np.float32)}
        out.append({"summary": summary, "series": series, "wall_s": 0.0})
    return out


@pytest.fixture
def experiment_file(tmp_path):
    """write(body='add("x")', steps=3) -> the path of an experiment file with those cells."""

    def write(body: str = 'add("x", recipe="fp32")', steps: int = 3, name: str = "exp"):
        path = tmp_path / f"{name}.py"
        path.write_text(EXPERIMENT.format(steps=steps, body=textwrap.indent(body, "    ")))
        return path

    return write


@pytest.fixture
def run_sweep():
    """run(path, out, **kw): the experiment file's sweep into `out` with the fake compute."""

    def run(path, out, **kw):
        kw.setdefault("compute", fake_compute)
        return sweep.run_experiment(sweep.load_experiment(path), out, progress=False, **kw)

    return run
