"""Computing one cell: its seeds as compiled training runs. Runs in any process.

A run is one cell at one seed triple. The seeds of a cell run in calls of at most
`config.seed_batch` seeds, and a seed's numbers are bit-identical whichever seeds share its call,
and however many. How, `Config.pad_seeds` chooses:

    False (the default)  on the CPU, the seeds of a call run one after the other in one program
                         (`jax.lax.map` over `make_train(cfg)`): each seed's computation is the
                         program of that seed alone, whatever the width, so a call is only as
                         wide as its seeds and a 1-seed run computes one seed. Off the CPU, as
                         True (a GPU computes a vmapped batch in parallel).
    True                 the seeds are vmapped (`jax.vmap`), every call `seed_batch` wide, the
                         last padded with copies of its first seed: XLA's CPU kernels depend on
                         the batch width (at width 4 the dots, activations and reductions become
                         one YNNPACK fusion with its own summation order; at width 1 the batch
                         axis is simplified away and reductions become reductions to a scalar,
                         vectorized another way), so only a fixed width is independent of the
                         other seeds. How the runs recorded before the field were computed
                         (`fp4lab.schema.RECORDED_BEFORE`); they reproduce with it.

What the sequential call costs against the vmapped one (little where the matmuls fill the
cores, more on a small MLP, where per-op overhead dominates) is measured by
`python benchmarks/sweep.py`; the figures are in docs/performance.md.

`compute_cell` takes and returns plain data, so a worker process or a Ray task can run it. It
and `check_cell` (which traces a cell before a sweep starts) are where the host-side sweep
reaches the trainer: both import it inside the function, on purpose and not to dodge a cycle
(train sits below sweep), so that a driver that only reads results never loads the trainer,
flax or optax (tests/sweep/test_index.py runs `ls` and `show` without them).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fp4lab.core import cpu_kernels
from fp4lab.schema import SIGNALS, STREAMS
from fp4lab.sweep import programs as stored_programs
from fp4lab.sweep import step_reports
from fp4lab.sweep.provenance import cpu
from fp4lab.train.config import Config

__all__ = [
    "call_width",
    "check_cell",
    "compute_cell",
    "clear_cache",
    "progress_every",
    "sequential",
    "use_compile_cache",
]


def use_compile_cache(
    folder: str | os.PathLike, min_compile_seconds: float = 0.5, programs: bool = False
) -> None:
    """Turns on jax's persistent compilation cache in `folder` for this process.

    A program compiled once (a cell's training run, a test's step) is then loaded from disk by
    every later process that compiles the same program with the same jax and flags: added seed
    batches, reruns and other test files skip compilation. The cached executable is the one a
    fresh compile produces, so results are bit-identical with and without the cache (tested).
    Programs that compile faster than `min_compile_seconds` are not written.

    With `programs`, cells' traced programs are kept in `folder/programs` too
    (`fp4lab.sweep.programs`), so a later process skips tracing and lowering as well; this
    process's worker processes inherit the setting.
    """
    Path(folder).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if programs:
        os.environ[stored_programs.ENV] = str(Path(folder) / "programs")


_COMPILED: dict[tuple[Config, int, int], tuple[Callable, float]] = {}  # (cfg, every, width)
_REPORT: list[Callable | None] = [None]  # where the step callbacks of the running call go
_TRACED: set[Config] = set()  # configs traced in this process (see `_compiled`)
_NO_SEAM: dict[Config, str] = {}  # the modules each traced config leaves without a seam


def progress_every(cfg: Config, reports: int = 50) -> int:
    """Steps between two progress reports from inside a cell: about `reports` per run."""
    return max(1, -(-cfg.steps // reports))


_OUT = ("loss", "grad_norm", "loss_scale")  # what a step report carries, in this order
# the per-step series a record keeps (loss_hp: Config.target_on; the signals: Config.signals)
SERIES = (*_OUT, "loss_hp", *SIGNALS)


def _kernel_reports() -> bool:
    """Whether step reports go through the CPU kernel's queue (a program jax's caches keep)
    rather than a Python callback (one they do not): on the CPU, where the kernels build."""
    return jax.default_backend() == "cpu" and cpu_kernels.available()


def _emit(done, run, out) -> None:
    """The step report compiled into a cell with progress (traced; `trainer.make_train`)."""
    if _kernel_reports():
        step_reports.report_step(done, run, jnp.stack([out[k] for k in _OUT]))
    else:
        jax.debug.callback(_on_step, done, run, out)


class _Drain:
    """While a program with kernel step reports runs: a thread that moves the queued reports to
    the running call's reporter about every `period` seconds, and the rest when it stops."""

    def __init__(self, period: float = 0.1):
        self.period = period
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="fp4lab-progress")

    def _loop(self) -> None:
        while not self.done.wait(self.period):
            self.flush()

    @staticmethod
    def flush() -> None:
        for done, run, values in step_reports.take_reports():
            _on_step(done, run, dict(zip(_OUT, values, strict=True)))

    def __enter__(self):
        step_reports.take_reports()  # left by an interrupted call: they belong to no one
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self.flush()


def _on_step(done, run, out) -> None:
    """Hands one seed's step report to the reporter of the running call (a compiled program
    outlives the call that compiled it). It never raises: a broken progress display must not
    stop a run."""
    report = _REPORT[0]
    if report is None:
        return
    try:
        report(int(done), tuple(int(v) for v in np.asarray(run).ravel()), out)
    except Exception:
        _REPORT[0] = None


def clear_cache(config: Config | None = None) -> None:
    """Forgets this process's compiled cells (one config, or all), so the next call compiles."""
    if config is None:
        _COMPILED.clear()
    else:
        for key in [k for k in _COMPILED if k[0] == config]:
            del _COMPILED[key]


def sequential(cfg: Config) -> bool:
    """Whether the seeds of `cfg`'s calls run one after the other here (`Config.pad_seeds`
    False, on the CPU backend), so that a call is only as wide as its seeds."""
    return not cfg.pad_seeds and jax.default_backend() == "cpu"


def call_width(cfg: Config, seeds: int) -> int:
    """How many seeds wide the call that computes `seeds` of them (<= seed_batch) is."""
    return seeds if sequential(cfg) else cfg.seed_batch


def _compiled(cfg: Config, keys, every: int = 0) -> tuple[Callable, float]:
    """jit(lax.map(train)) where `sequential`, else jit(vmap(train)), compiled for `cfg` and the
    width of `keys` (cached per process), and its compile seconds; with `every` > 0, with step
    reports every `every` steps. With stored programs on (`fp4lab.sweep.programs`), what
    compiles is the exported program (not for reports through a Python callback, which cannot
    be exported)."""
    from fp4lab.train import trainer  # lazy: the trainer (flax, optax) loads on the first cell

    width = len(jax.tree.leaves(keys)[0])
    if (cfg, every, width) not in _COMPILED:
        if cfg in _TRACED:
            # a second trace of one config in a process (with and without step reports, or
            # after clear_cache) reused jax's cached inner traces of the first and got an
            # executable that wants the first's hoisted constants ("compiled for 11 inputs
            # but called with 3", the scanned LM): start the traces afresh (for another call
            # width too)
            jax.clear_caches()
        _TRACED.add(cfg)
        t0 = time.perf_counter()
        train = trainer.make_train(cfg, _emit, every) if every else trainer.make_train(cfg)
        _NO_SEAM[cfg] = ", ".join(train.no_seam)
        train = _packed(train)
        if sequential(cfg):

            @functools.wraps(train)  # the program keeps its name, jit_train
            def seeds(keys):
                return jax.lax.map(train, keys)  # one seed after the other

        else:
            seeds = jax.vmap(train)
        where = stored_programs.folder()
        if (
            where is not None
            and (not every or _kernel_reports())
            and jax.default_backend() == "cpu"
        ):
            program = stored_programs.exported(seeds, cfg, keys, where, every)
            fn = jax.jit(program.call).lower(keys).compile()
        else:
            fn = jax.jit(seeds).lower(keys).compile()
        _COMPILED[cfg, every, width] = fn, time.perf_counter() - t0
    return _COMPILED[cfg, every, width]


_PACKED = "telemetry_packed"


def _packed(train: Callable) -> Callable:
    """`train` whose telemetry {metric: (logs,)} leaves the program as one array per dtype and
    shape, under the key `_PACKED`: {"groups": (({metric: ()}, ...), ...), "values": ((metrics
    of the group, logs), ...)}.

    Each output of a program is a fusion that XLA compiles on its own: a small scanned LM's 555
    metrics, one output each, took about a third of its compile (without LLVM optimization).
    Stacked again, they are the trainer's buffer of measured steps, which XLA passes through.
    The names ride in the output's structure, which a stored (exported) program keeps too;
    `_unpacked` makes the dict again on the host, its keys sorted as a program's output dict
    has them. The values are moved, not computed: the same bits
    (tests/sweep/test_seed_width.py)."""

    @functools.wraps(train)  # the program keeps its name, jit_train
    def run(keys):
        result = train(keys)
        tel = result["telemetry"]
        if not tel:
            return result
        groups: dict[tuple, list[str]] = {}
        for k, v in tel.items():
            groups.setdefault((v.dtype, v.shape), []).append(k)
        result = {k: v for k, v in result.items() if k != "telemetry"}
        result[_PACKED] = {
            "groups": tuple(tuple({k: ()} for k in names) for names in groups.values()),
            "values": tuple(jnp.stack([tel[k] for k in names]) for names in groups.values()),
        }
        return result

    return run


def _unpacked(one: dict) -> dict:
    """One seed's run arrays with the telemetry of `_packed` a dict {metric: values} again."""
    if _PACKED not in one:
        return one
    packed = one[_PACKED]
    rows = {}
    for names, values in zip(packed["groups"], packed["values"], strict=True):
        values = np.asarray(values)
        rows |= {next(iter(d)): values[j].copy() for j, d in enumerate(names)}
    one = {k: v for k, v in one.items() if k != _PACKED}
    one["telemetry"] = dict(sorted(rows.items()))  # as jax returns a dict: keys sorted
    return one


def compute_cell(
    config: dict[str, Any],
    seeds: list[tuple[int, int, int]],
    progress: Callable[[dict[str, Any]], None] | None = None,
    every: int | None = None,
) -> list[dict]:
    """Runs the seeds of one cell; returns one dict per seed: summary, series, telemetry, wall_s
    (run seconds per seed), compile_s (the seconds this call spent compiling the program of the
    seed's call, 0 when it was cached) and cpu (the CPU that computed it,
    `fp4lab.sweep.provenance.cpu`: a worker's, not the driver's).

    Seeds run in calls of at most `seed_batch` (`call_width`; vmapped and padded with copies of
    the first seed under `Config.pad_seeds`), so each seed's numbers are bit-identical whichever
    seeds share its call. Takes and returns only plain data, so any process (or a Ray worker)
    can run it.

    `progress`, when given, receives events as plain dicts while the cell runs:
    {"event": "compile"} before a compile and {"event": "compiled", "seconds", "width"} after it
    (width: the seeds the compiled call takes, `call_width`), then
    {"event": "step", "seed": (init, data, quant), "step", "steps", "loss", "grad_norm",
    "loss_scale"} every `every` steps of each seed (default `progress_every`; 0: no step events,
    the compile events only, and the program of a run without them) from inside the
    compiled loop. The numbers are bit-identical with and without it. The program with reports is
    compiled (and cached) apart from the one without; on the CPU its reports go through a
    kernel's queue (`fp4lab.sweep.step_reports.report_step`, drained by a thread while it runs),
    so jax's persistent cache and the stored programs keep it as they keep the one without;
    elsewhere, or without the kernels, through a Python callback, which they do not keep.
    """
    # lazy, as the module docstring says: the trainer, the tasks and the summary (which imports
    # the tasks) load flax and optax, which `import fp4lab.sweep` does not
    from fp4lab.train import tasks, trainer
    from fp4lab.train.summary import summarize

    cfg = Config.from_dict(config)
    host = cpu()
    task = tasks.make_task(cfg)
    out = []
    batch = cfg.seed_batch
    if progress is None:
        every = 0
    elif every is None:
        every = progress_every(cfg)
    elif isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ValueError(f"compute_cell: every={every!r}; must be an int >= 0")
    fresh: dict[int, float] = {}  # compile seconds of the widths compiled by this call
    for lo in range(0, len(seeds), batch):
        chunk = [tuple(int(v) for v in s) for s in seeds[lo : lo + batch]]
        width = call_width(cfg, len(chunk))
        padded = chunk + [chunk[0]] * (width - len(chunk))
        keys = jax.tree.map(lambda *k: jnp.stack(k), *[trainer.make_keys(*s) for s in padded])
        cached = (cfg, every, width) in _COMPILED
        if progress is not None and not cached:
            progress({"event": "compile"})
        fn, compile_s = _compiled(cfg, keys, every)
        if not cached:
            fresh[width] = compile_s
            if progress is not None:
                progress({"event": "compiled", "seconds": compile_s, "width": width})
        if progress is not None and every:
            _REPORT[0] = _step_reporter(progress, keys, chunk, cfg.steps)
        t0 = time.perf_counter()
        try:
            if every and _kernel_reports():
                with _Drain():
                    arrays = jax.device_get(fn(keys))
            else:
                arrays = jax.device_get(fn(keys))
        finally:
            _REPORT[0] = None
        wall = (time.perf_counter() - t0) / len(chunk)
        for i, _ in enumerate(chunk):
            one = _unpacked(jax.tree.map(lambda a, i=i: np.asarray(a[i]), arrays))
            summary = summarize(cfg, one, task)
            summary["compile_s"] = fresh.get(width, 0.0)
            summary["no_seam"] = _NO_SEAM.get(cfg, "")
            series = {k: one[k] for k in SERIES if k in one}
            tel = {"steps": trainer.log_steps(cfg), "metrics": one["telemetry"]}
            out.append(
                {
                    "summary": summary,
                    "series": series,
                    "telemetry": tel,
                    "wall_s": wall,
                    "cpu": host,
                }
            )
    return out


def _step_reporter(progress: Callable, keys, chunk: list[tuple], steps: int) -> Callable:
    """The reporter of one call: tells its seeds apart by their stream keys' data
    (padding copies of the first seed report as the first seed) and passes plain events on."""
    data = [np.asarray(jax.random.key_data(keys[s])) for s in STREAMS]
    data = np.concatenate([d.reshape(len(d), -1) for d in data], axis=1)
    seed_of = {}
    for row, seed in zip(data, chunk + [chunk[0]] * (len(data) - len(chunk)), strict=True):
        seed_of.setdefault(tuple(int(v) for v in row), seed)

    seen: set = set()

    def report(done: int, run: tuple, out) -> None:
        seed = seed_of.get(run)
        if (seed, done) in seen:  # a padding copy of the first seed
            return
        seen.add((seed, done))
        event = {"event": "step", "seed": seed, "step": done, "steps": steps}
        progress(event | {k: float(np.asarray(v)) for k, v in out.items()})

    return report


def check_cell(config: Config) -> str | None:
    """The reason (one line) why a cell's training run would fail at its start, or None.

    Traces the run (`make_train(config)` on seeds (0, 0, 0)) with `jax.eval_shape`: every shape
    and static check of the step, the phases and the evaluation runs, nothing is computed.
    Catches the errors a config raises before any number exists (a width the block size of a
    quantizer does not divide, a layout the recipe cannot take)."""
    from fp4lab.train import trainer  # the trainer only where a cell is computed (or traced)

    try:
        jax.eval_shape(trainer.make_train(config), trainer.make_keys(0, 0, 0))
    except (ValueError, TypeError, NotImplementedError) as e:
        text = str(e).strip().splitlines()
        return f"{type(e).__name__}: {text[0] if text else ''}"
    return None
