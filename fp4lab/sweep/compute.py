"""Computing one cell: its seeds as vmapped, compiled training runs. Runs in any process.

A run is one cell at one seed triple. The seeds of a cell run as vmapped calls of
`config.seed_batch` seeds (fewer are padded with copies of the first): XLA's CPU kernels depend
on the batch width, so a fixed width makes a seed's result independent of which other seeds
share its call, bit for bit. `compute_cell` takes and returns plain data, so a worker process or
a Ray task can run it; it is the one place where the host-side sweep reaches the trainer, which
it imports when first called (a driver that only reads results never loads jax's trainer).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fp4lab.train.config import Config

__all__ = ["compute_cell", "clear_cache", "use_compile_cache"]


def use_compile_cache(folder: str | os.PathLike, min_compile_seconds: float = 0.5) -> None:
    """Turns on jax's persistent compilation cache in `folder` for this process.

    A program compiled once (a cell's training run, a test's step) is then loaded from disk by
    every later process that compiles the same program with the same jax and flags: added seed
    batches, reruns and other test files skip compilation. The cached executable is the one a
    fresh compile produces, so results are bit-identical with and without the cache (tested).
    Programs that compile faster than `min_compile_seconds` are not written.
    """
    import jax

    Path(folder).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


_COMPILED: dict[Config, tuple[Callable, float]] = {}


def clear_cache(config: Config | None = None) -> None:
    """Forgets this process's compiled cells (one config, or all), so the next call compiles."""
    if config is None:
        _COMPILED.clear()
    else:
        _COMPILED.pop(config, None)


def _compiled(cfg: Config, keys) -> tuple[Callable, float]:
    """jit(vmap(train)) compiled for `cfg` (cached per process), and its compile seconds."""
    import jax

    from fp4lab.train import trainer

    if cfg not in _COMPILED:
        t0 = time.perf_counter()
        fn = jax.jit(jax.vmap(trainer.make_train(cfg))).lower(keys).compile()
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

    from fp4lab.train import tasks, trainer
    from fp4lab.train.summary import summarize

    cfg = Config.from_dict(config)
    task = tasks.make_task(cfg)
    out = []
    width = cfg.seed_batch
    cached = cfg in _COMPILED
    for lo in range(0, len(seeds), width):
        chunk = list(seeds[lo : lo + width])
        padded = chunk + [chunk[0]] * (width - len(chunk))
        keys = jax.tree.map(lambda *k: jnp.stack(k), *[trainer.make_keys(*s) for s in padded])
        fn, compile_s = _compiled(cfg, keys)
        t0 = time.perf_counter()
        arrays = jax.device_get(fn(keys))
        wall = (time.perf_counter() - t0) / len(chunk)
        for i, _ in enumerate(chunk):
            one = jax.tree.map(lambda a, i=i: np.asarray(a[i]), arrays)
            summary = summarize(cfg, one, task)
            summary["compile_s"] = 0.0 if cached else compile_s
            series = {k: one[k] for k in ("loss", "grad_norm", "loss_scale")}
            tel = {"steps": trainer.log_steps(cfg), "metrics": one["telemetry"]}
            out.append({"summary": summary, "series": series, "telemetry": tel, "wall_s": wall})
    return out
