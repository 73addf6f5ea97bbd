"""Host-side sweeps: experiment files, executors, the runner and the results store.

    experiment   experiment files: get_config(), sweep(add), cells and seeds
    compute      compute_cell: one cell's seeds as compiled runs, a call per batch (any process)
    programs     cells' traced programs on disk (jax.export): later processes skip the trace
    executors    local executors (in process, worker processes)
    ray          the Ray executor (workers compute, the driver writes)
    reaper       what a Ray driver started dies with it, also on a kill -9
    runner       run_experiment: what is left, the executor, the store
    progress     the live progress display (compiles, steps, an ETA)
    lock         one writer per results folder (an advisory lock)
    stream       `--stream`: each step of each run appended to stream.jsonl
    store        run ids, current and stale runs, load() as pandas
    provenance   where a run was computed: versions, git, backend, device, CPU
    cells        the manifest's cells checked against the records: what each label pools
    failures     why runs fail, in one line: before they run (--dry-run traces) and after
    records      atomic writes, checked reads, bad entries skipped with a warning
    reproduce    reproduce(folder, run_id): one stored run again, bit for bit
    replicate    replicate(folder, seeds_from): a finished study on fresh seeds, its words
    own          fp4lab.own: your model, loss and data from Python (train, sweep)

The trainer is reached only inside `compute_cell`; the rest runs without flax.
"""

import importlib

# name -> its module: loaded on first use (`import fp4lab.sweep` loads neither jax nor pandas;
# `compute_cell` and `clear_cache` load jax, the trainer only once a cell is computed)
_LAZY = {
    "clear_cache": "compute",
    "compute_cell": "compute",
    **dict.fromkeys(
        ("Cell", "Experiment", "ExperimentError", "load_experiment", "parse_overrides"),
        "experiment",
    ),
    "seed_triples": "experiment",
    "CorruptRecord": "records",
    "StoreError": "records",
    "ReproductionError": "reproduce",
    "reproduce": "reproduce",
    "replicate": "replicate",
    **dict.fromkeys(("EXECUTORS", "FolderTaken", "pending", "run_experiment"), "runner"),
    "NUMERICS_VERSION": "store",
    "load": "store",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Cell",
    "clear_cache",
    "CorruptRecord",
    "EXECUTORS",
    "Experiment",
    "ExperimentError",
    "FolderTaken",
    "NUMERICS_VERSION",
    "ReproductionError",
    "StoreError",
    "compute_cell",
    "load",
    "load_experiment",
    "parse_overrides",
    "pending",
    "replicate",
    "reproduce",
    "run_experiment",
    "seed_triples",
]
