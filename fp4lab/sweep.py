"""Sweeps: experiment files, cells, seeds, run identity and the executors.

An experiment file is plain Python with two functions:

    def get_config():            # the base Config (or a dict of overrides of Config())
        return fl.Config(task="markov", steps=300, ...)

    def sweep(add):              # the grid: one add(...) per cell
        for recipe in ("bf16", "nvfp4"):
            add(recipe=recipe, seeds=4)

`add(label=None, seeds=None, **overrides)` adds a cell: the base config with `overrides`. `seeds`
is an int n (seeds 0..n-1, the same integer in every stream), a dict {"init": [...],
"data": [...], "quant": [...]} (the product of the lists; a missing stream is [0]), or a list
of (init, data, quant) triples. A module-level `SEEDS` sets the default (else 1). Everything is
validated when the file is loaded, before anything runs; errors name the file, the line of the
`add` call, the field and the allowed values. An optional `analyze(results)` returns
{name: DataFrame}: the experiment's own tables, which `fp4lab run` prints and writes to
`<out>/<name>.csv` once the sweep is done.

A run is one cell at one seed triple; its id hashes its resolved config and seeds
(`fp4lab.store.run_id`). The seeds of a cell run as vmapped calls of `config.seed_batch` seeds
(fewer are padded with copies of the first): XLA's CPU kernels depend on the batch width, so a
fixed width makes a seed's result independent of which other seeds share its call, bit for bit.

Executors compute cells and return arrays; the driver (this process) writes the store, so a
worker never touches the disk. `local` runs cells here, one after another, or in `workers`
processes (compilation dominates small cells, and compiles of different cells run in parallel).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import math
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from fp4lab import config as C
from fp4lab import store as S

__all__ = [
    "Cell",
    "Experiment",
    "ExperimentError",
    "load_experiment",
    "seed_triples",
    "compute_cell",
    "run_experiment",
]

EXECUTORS = ("local", "ray")


class ExperimentError(ValueError):
    """An experiment file that cannot run: where, which field, what is allowed."""


@dataclasses.dataclass(frozen=True)
class Cell:
    """One grid point: a resolved config and its seed triples (init, data, quant)."""

    label: str
    overrides: dict[str, Any]
    config: C.Config
    seeds: tuple[tuple[int, int, int], ...]
    where: str = ""  # file:line of the add() call

    def run_ids(self) -> list[str]:
        cfg = self.config.to_dict()
        return [S.run_id(cfg, s) for s in self.seeds]


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    path: str
    base: C.Config
    cells: tuple[Cell, ...]
    # the file's optional analyze(results) -> {name: DataFrame}, run by `fp4lab run` at the end
    analyze: Callable | None = dataclasses.field(default=None, compare=False, repr=False)

    def manifest(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "file": Path(self.path).name,
            "cells": [
                {"label": c.label, "overrides": c.overrides, "run_ids": c.run_ids()}
                for c in self.cells
            ],
        }

    @property
    def n_runs(self) -> int:
        return sum(len(c.seeds) for c in self.cells)


def seed_triples(seeds) -> tuple[tuple[int, int, int], ...]:
    """Seed triples (init, data, quant) from an int, a per-stream dict or a list of triples."""
    if isinstance(seeds, bool):
        raise ExperimentError(f"seeds={seeds!r}; allowed: an int, a dict or a list of triples")
    if isinstance(seeds, int):
        if seeds < 1:
            raise ExperimentError(f"seeds={seeds}; must be >= 1")
        return tuple((i, i, i) for i in range(seeds))
    if isinstance(seeds, dict):
        bad = sorted(set(seeds) - set(C.STREAMS))
        if bad:
            raise ExperimentError(f"seeds has unknown streams {bad}; allowed: {C.STREAMS}")
        lists = [list(seeds.get(s, [0])) for s in C.STREAMS]
        for s, values in zip(C.STREAMS, lists, strict=True):
            if not values or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in values
            ):
                raise ExperimentError(f"seeds[{s!r}]={values!r}; must be a non-empty list of ints")
        return tuple(itertools.product(*lists))
    try:
        triples = tuple(tuple(int(v) for v in t) for t in seeds)
    except (TypeError, ValueError):
        triples = ()
    if not triples or any(len(t) != 3 for t in triples):
        raise ExperimentError(
            f"seeds={seeds!r}; allowed: an int n, {{'init': [...], 'data': [...], "
            "'quant': [...]}, or a list of (init, data, quant) triples"
        )
    return triples


def _label(overrides: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in overrides.items()) or "base"


def load_experiment(
    path: str | Path, *, seeds: int | None = None, steps: int | None = None
) -> Experiment:
    """Loads and validates an experiment file. `seeds` and `steps` override every cell."""
    path = Path(path)
    if not path.is_file():
        raise ExperimentError(f"{path}: no such experiment file")
    spec = importlib.util.spec_from_file_location(f"fp4lab_experiment_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise ExperimentError(f"{path}: the file raised {type(e).__name__}: {e}") from e
    for fn in ("get_config", "sweep"):
        if not callable(getattr(module, fn, None)):
            raise ExperimentError(f"{path}: defines no {fn}(); an experiment needs get_config()")
    try:
        base = module.get_config()
        base = C.make(base) if isinstance(base, dict) else base
    except C.ConfigError as e:
        raise ExperimentError(f"{path}: get_config(): {e}") from e
    if not isinstance(base, C.Config):
        raise ExperimentError(f"{path}: get_config() returned {type(base).__name__}; need Config")
    if steps is not None:
        base = base.replace(steps=steps)
    default_seeds = getattr(module, "SEEDS", 1)
    forced_seeds = seeds
    cells: list[Cell] = []

    def add(label: str | None = None, *, seeds: Any = None, **overrides):
        frame = sys._getframe(1)
        where = f"{path}:{frame.f_lineno}" if frame.f_code.co_filename == str(path) else str(path)
        try:
            if steps is not None:
                overrides.pop("steps", None)
            cfg = C.make(overrides, base)
            chosen = next(s for s in (forced_seeds, seeds, default_seeds) if s is not None)
            triples = seed_triples(chosen)
        except (C.ConfigError, ExperimentError) as e:
            raise ExperimentError(f"{where}: cell {_label(overrides)}: {e}") from e
        cells.append(Cell(label or _label(overrides), dict(overrides), cfg, triples, where))

    module.sweep(add)
    if not cells:
        raise ExperimentError(f"{path}: sweep(add) added no cells")
    labels = [c.label for c in cells]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise ExperimentError(f"{path}: cells with the same label {dupes}")
    name = getattr(module, "NAME", path.stem)
    analyze = getattr(module, "analyze", None)
    if analyze is not None and not callable(analyze):
        raise ExperimentError(f"{path}: analyze is {type(analyze).__name__}; need a function")
    return Experiment(name=name, path=str(path), base=base, cells=tuple(cells), analyze=analyze)


# ---------------------------------------------------------------------------------------------
# Computing a cell (in any process).

_COMPILED: dict[C.Config, tuple[Callable, float]] = {}


def _compiled(cfg: C.Config, keys) -> tuple[Callable, float]:
    """jit(vmap(train)) compiled for `cfg` (cached per process), and its compile seconds."""
    import jax

    from fp4lab import train as TR

    if cfg not in _COMPILED:
        t0 = time.perf_counter()
        fn = jax.jit(jax.vmap(TR.make_train(cfg))).lower(keys).compile()
        _COMPILED[cfg] = fn, time.perf_counter() - t0
    return _COMPILED[cfg]


def compute_cell(config: dict[str, Any], seeds: list[tuple[int, int, int]]) -> list[dict]:
    """Runs the seeds of one cell; returns one dict per seed: summary, series, telemetry, wall_s
    (run seconds per seed) and compile_s (the cell's compile seconds, 0 when cached).

    Seeds run in vmapped calls of `seed_batch` (the last call padded with the first seed), so
    each seed's numbers are bit-identical whichever seeds share its call. Takes and returns only
    plain data, so any process (or a Ray worker) can run it.
    """
    import jax
    import jax.numpy as jnp

    from fp4lab import train as TR

    cfg = C.Config.from_dict(config)
    task = TR.make_task(cfg)
    out = []
    width = cfg.seed_batch
    cached = cfg in _COMPILED
    for lo in range(0, len(seeds), width):
        chunk = list(seeds[lo : lo + width])
        padded = chunk + [chunk[0]] * (width - len(chunk))
        keys = jax.tree.map(lambda *k: jnp.stack(k), *[TR.make_keys(*s) for s in padded])
        fn, compile_s = _compiled(cfg, keys)
        t0 = time.perf_counter()
        arrays = jax.device_get(fn(keys))
        wall = (time.perf_counter() - t0) / len(chunk)
        for i, _ in enumerate(chunk):
            one = jax.tree.map(lambda a, i=i: np.asarray(a[i]), arrays)
            summary = TR.summarize(cfg, one, task)
            summary["compile_s"] = 0.0 if cached else compile_s
            series = {k: one[k] for k in ("loss", "grad_norm", "loss_scale")}
            tel = {"steps": TR.log_steps(cfg), "metrics": one["telemetry"]}
            out.append({"summary": summary, "series": series, "telemetry": tel, "wall_s": wall})
    return out


# ---------------------------------------------------------------------------------------------
# Running an experiment.


class Progress:
    """One status line on stderr: cells done, runs done, elapsed, ETA, the latest loss."""

    def __init__(self, n_cells: int, n_runs: int, stream=None, enabled: bool = True):
        self.n_cells, self.n_runs = n_cells, n_runs
        self.cells = self.runs = 0
        self.t0 = time.perf_counter()
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.last = ""

    def update(self, cells: int = 0, runs: int = 0, loss: float | None = None, note: str = ""):
        self.cells += cells
        self.runs += runs
        if loss is not None:
            self.last = f"loss {loss:.4f}"
        if not self.enabled:
            return
        el = time.perf_counter() - self.t0
        eta = el / self.cells * (self.n_cells - self.cells) if self.cells else math.nan
        width = 24
        fill = int(width * self.cells / max(self.n_cells, 1))
        bar = "#" * fill + "." * (width - fill)
        line = (
            f"\r[{bar}] cells {self.cells}/{self.n_cells}  runs {self.runs}/{self.n_runs}  "
            f"{_dur(el)} elapsed  ETA {_dur(eta)}  {self.last} {note}"
        )
        self.stream.write(line.ljust(100)[:160])
        self.stream.flush()

    def close(self):
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def _dur(s: float) -> str:
    if not math.isfinite(s):
        return "--"
    s = int(round(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def pending(experiment: Experiment, store: S.Store) -> list[tuple[Cell, list]]:
    """[(cell, seeds not yet finished)] for every cell with work left."""
    todo = []
    for cell in experiment.cells:
        left = [
            s for s, rid in zip(cell.seeds, cell.run_ids(), strict=True) if not store.finished(rid)
        ]
        if left:
            todo.append((cell, left))
    return todo


def _records(experiment, cell, seeds, results, error=None, prov=None) -> Iterable[dict]:
    cfg = cell.config.to_dict()
    for i, s in enumerate(seeds):
        rec = {
            "run_id": S.run_id(cfg, s),
            "experiment": experiment.name,
            "cell": cell.label,
            "overrides": cell.overrides,
            "config": cfg,
            "seeds": dict(zip(C.STREAMS, (int(v) for v in s), strict=True)),
            "provenance": prov,
        }
        if error is None:
            rec |= {"status": "ok"} | results[i]
        else:
            rec |= {"status": "failed", "error": error, "summary": {}, "wall_s": math.nan}
        yield rec


def run_experiment(
    experiment: Experiment,
    out: str | Path,
    *,
    executor: str = "local",
    workers: int = 1,
    progress: bool = True,
    **executor_options,
) -> dict[str, int]:
    """Runs every unfinished run of `experiment` into the store at `out`.

    Returns counts {"cells", "runs", "skipped", "done", "failed"}. A cell that raises is
    recorded as failed (with its traceback) and the sweep goes on.
    """
    if executor not in EXECUTORS:
        raise ExperimentError(f"executor={executor!r}; allowed: {', '.join(EXECUTORS)}")
    store = S.Store(out)
    store.write_experiment(experiment.manifest())
    todo = pending(experiment, store)
    n_todo = sum(len(s) for _, s in todo)
    counts = {"cells": len(experiment.cells), "runs": experiment.n_runs}
    counts |= {"skipped": experiment.n_runs - n_todo, "done": 0, "failed": 0}
    bar = Progress(len(todo), n_todo, enabled=progress)
    bar.update(note="compiling" if todo else "nothing to do")
    prov = S.provenance()

    def finish(cell, seeds, results, error):
        for rec in _records(experiment, cell, seeds, results, error, prov):
            store.write(rec)
        counts["failed" if error else "done"] += len(seeds)
        loss = None if error else results[-1]["summary"]["final_loss"]
        bar.update(cells=1, runs=len(seeds), loss=loss, note="(a cell failed)" if error else "")

    try:
        if executor == "ray":
            from fp4lab import ray_executor

            ray_executor.run(todo, finish, **executor_options)
        elif workers > 1 and len(todo) > 1:
            _run_processes(todo, finish, workers)
        else:
            for cell, seeds in todo:
                try:
                    results = compute_cell(cell.config.to_dict(), seeds)
                except Exception:
                    finish(cell, seeds, None, traceback.format_exc())
                else:
                    finish(cell, seeds, results, None)
    finally:
        bar.close()
    return counts


def _run_processes(todo, finish, workers: int) -> None:
    import concurrent.futures as cf
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # a fresh jax per worker (fork after jax init is unsafe)
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {
            pool.submit(_compute_or_error, cell.config.to_dict(), seeds): (cell, seeds)
            for cell, seeds in todo
        }
        try:
            for fut in cf.as_completed(futures):
                cell, seeds = futures[fut]
                results, error = fut.result()
                finish(cell, seeds, results, error)
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def _compute_or_error(config, seeds):
    try:
        return compute_cell(config, seeds), None
    except Exception:
        return None, traceback.format_exc()
