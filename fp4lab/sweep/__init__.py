"""Host-side sweeps: experiment files, executors, the runner and the results store.

    experiment   experiment files: get_config(), sweep(add), cells and seeds
    design       seed designs: crossed() crosses the quant stream with the others
    compute      compute_cell: one cell's seeds as compiled runs, a call per batch (any process)
    step_reports report_step / take_reports: step reports out of a compiled run (a C++ queue)
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
    reproduction reproduce(folder, run_id): one stored run again, bit for bit
    fresh        replicate(folder, seeds_from): a finished study on fresh seeds, its words
    own          fp4lab.own: your model, loss and data from Python (train, sweep)

The trainer is reached only inside `compute_cell`; the rest runs without flax. The names the
package offers are listed in `__init__.pyi` and loaded on first use (`import fp4lab.sweep` loads
neither jax nor pandas; `compute_cell` and `clear_cache` load jax, the trainer only once a cell is
computed).
"""

from fp4lab.lazy import attach_stub

__getattr__, __dir__, __all__ = attach_stub(
    __name__, __file__, {"load": ("fp4lab.sweep.store", "load", "fp4lab.load")}
)
del attach_stub
