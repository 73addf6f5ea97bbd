"""Traced programs on disk: a cell's training run exported once, so later processes skip tracing.

jax's persistent compilation cache skips XLA's compile, not what comes before it: tracing the model
in Python and lowering it to StableHLO, about 40 % of what a cached cell costs on the CPU. With
`use_compile_cache(folder, programs=True)` (what `fp4lab run` does), `fp4lab.sweep.compute` exports
(`jax.export`) each cell's call (lax.map or vmap of train) into `folder/programs` and compiles the
exported program; a later process that computes the same cell loads the exported program from
there, and its compile then comes from jax's cache as well. Both processes compile the same
exported program, so results do not depend on which of them traced it.

A stored program is the trace of the code that made it, so its key covers everything the trace
reads: the config (`Config.to_dict`, which writes a recipe registered at run time as its value),
the seed batch's shapes and dtypes, the source files of the fp4lab package, a text task's file
(`store.data_hashes`), the package versions of a run's provenance (`store.package_versions`:
fp4lab, jax, jaxlib, flax, optax, ml_dtypes, numpy), jax's flags, the backend and whether fp4lab's
CPU kernels can be built (without them telemetry traces its reference formulas). What it cannot see
is code that changes fp4lab while it runs (a function patched from an experiment file or a test):
such runs should turn the cache off (`--no-compile-cache`). Step reports go through a CPU kernel
(`fp4lab.sweep.step_reports.report_step`), so a program with them is stored too (its key counts the
steps between reports); where the kernels do not build, reports are a Python callback, and such a
program cannot be exported and is not stored.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

import jax
from jax import export

from fp4lab.core import cpu_kernels
from fp4lab.sweep import store
from fp4lab.sweep.records import StoreError, write_atomic
from fp4lab.train.config import Config

__all__ = ["ENV", "folder", "program_key", "exported"]

ENV = "FP4LAB_PROGRAM_CACHE"  # the folder of stored programs; set, so worker processes inherit it
_UNTRACED_FLAGS = ("compilation_cache", "persistent_cache", "log", "dump", "pprint", "traceback")


def folder() -> Path | None:
    """The folder of stored programs ($FP4LAB_PROGRAM_CACHE), or None when they are off."""
    value = os.environ.get(ENV)
    return Path(value) if value else None


@functools.cache
def _source_digest() -> str:
    """sha256 over the fp4lab package's source files (paths and contents), once per process."""
    root = Path(__file__).resolve().parents[1]  # the fp4lab package
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".cc")):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def program_key(cfg: Config, keys: Any, every: int = 0) -> str:
    """The key of `cfg`'s training run traced for the seed batch `keys` (module docstring),
    with step reports every `every` steps (0: none)."""
    flags = {
        k: repr(v)
        for k, v in sorted(jax.config.values.items())
        if not any(word in k for word in _UNTRACED_FLAGS)
    }
    avals = [
        (str(path), str(getattr(leaf, "dtype", type(leaf))), tuple(getattr(leaf, "shape", ())))
        for path, leaf in jax.tree_util.tree_leaves_with_path(keys)
    ]
    config = cfg.to_dict()
    parts = {
        "config": config,
        "avals": avals,
        "source": _source_digest(),
        "data": store.data_hashes(config),  # a text task's file
        "versions": store.package_versions(),
        "flags": flags,
        "backend": jax.default_backend(),
        # without the kernels telemetry traces its reference formulas and the random keys
        # their written-out hash (the same bits, another program)
        "kernels": cpu_kernels.available(),
    }
    if every:
        parts["every"] = every
    blob = json.dumps(parts, sort_keys=True, default=repr).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def exported(fn, cfg: Config, keys: Any, where: Path, every: int = 0):
    """The jax.export.Exported of jit(`fn`) at `keys` (`fn` with step reports every `every`
    steps, 0: none): loaded from `where` when stored there, else traced, exported and stored.
    Makes sure the CPU kernels the program calls are registered in this process (loading a
    program does not trace the code that would)."""
    path = where / f"{program_key(cfg, keys, every)}.program"
    if path.exists():
        try:
            head, _, body = path.read_bytes().partition(b"\n")
            meta = json.loads(head)
            program = export.deserialize(bytearray(body))
        except Exception as e:  # a damaged file: traced again and replaced
            warnings.warn(
                f"fp4lab: cannot read the stored program {path} ({e}); tracing it again",
                RuntimeWarning,
                stacklevel=2,
            )
        else:
            if meta.get("kernels"):
                cpu_kernels.available()  # registers them (the key says they build here)
            return program
    checks = [export.DisabledSafetyCheck.custom_call(t) for t in cpu_kernels.TARGETS]
    program = export.export(jax.jit(fn), disabled_checks=checks)(keys)
    text = program.mlir_module()
    meta = {"kernels": sorted(t for t in cpu_kernels.TARGETS if f"custom_call @{t}(" in text)}
    data = json.dumps(meta).encode() + b"\n" + bytes(program.serialize())
    try:  # atomic: a reader never sees half a file
        write_atomic(path, data)
    except StoreError as e:  # a full or read-only disk costs the next process a trace, no more
        warnings.warn(f"fp4lab: cannot store the traced program ({e})", RuntimeWarning, 2)
    return program
