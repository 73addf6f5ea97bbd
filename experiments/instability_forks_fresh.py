"""The forks study again, on fresh parents: seeds 16-23 of the spiking cell, run on this machine.

    fp4lab run experiments/instability_forks_fresh_parents.py --workers 2   # the parents first
    fp4lab run experiments/instability_forks_fresh.py --workers 2

experiments/instability_forks.py's three changes (the LayerNorm vectors back to high
precision, the GEMMs to MXFP4, half the learning rate), each made 50 steps before the first
spike of the first 6 spiking runs of results/instability_forks_fresh_parents/ ("bf16+ln" on
seeds 16-23; why fresh parents and not the committed replication's: that file's docstring).
The same tables and figure as the committed forks study, by its own `analyze`.
"""

import importlib.util
from pathlib import Path

from fp4lab.sweep import forks
from fp4lab.train.config import Config

PARENT = Path(__file__).resolve().parents[1] / "results" / "instability_forks_fresh_parents"
# the committed forks study, loaded by its path: an `import instability_forks` would take the
# first module of that name on sys.path, which need not be the file beside this one
_spec = importlib.util.spec_from_file_location(
    "instability_forks_committed", Path(__file__).with_name("instability_forks.py")
)
study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study)


def get_config():
    return Config()  # every fork brings its parent's whole config


def sweep(add):
    changes, before, first = study.CHANGES, study.BEFORE, study.FIRST
    forks.add_forks(add, PARENT, changes=changes, before=before, cells=["bf16+ln"], first=first)


def analyze(results):
    return study.analyze(results, PARENT)
