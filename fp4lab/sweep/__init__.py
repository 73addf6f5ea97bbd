"""Host-side sweeps: experiment files, executors, the runner and the results store.

    experiment   experiment files: get_config(), sweep(add), cells and seeds
    compute      compute_cell: one cell's seeds as vmapped, compiled runs (any process)
    executors    local executors (in process, worker processes)
    ray          the Ray executor (workers compute, the driver writes)
    runner       run_experiment: what is left, the executor, the store, progress
    store        run ids, atomic records, provenance, load() as pandas

The trainer is reached only inside `compute_cell`; the rest runs without flax.
"""

from fp4lab.sweep.compute import clear_cache, compute_cell
from fp4lab.sweep.experiment import (
    Cell,
    Experiment,
    ExperimentError,
    load_experiment,
    seed_triples,
)
from fp4lab.sweep.runner import EXECUTORS, pending, run_experiment

__all__ = [
    "Cell",
    "clear_cache",
    "EXECUTORS",
    "Experiment",
    "ExperimentError",
    "compute_cell",
    "load_experiment",
    "pending",
    "run_experiment",
    "seed_triples",
]
