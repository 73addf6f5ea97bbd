"""Shared pieces of the reliability tests: a tiny experiment file and a compute without jax."""

import textwrap

import pytest
from fakes import fake_compute  # tests/fakes.py

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
