"""Your own model, loss and data from Python: seeds, cells and the store without a seed loop.

    import fp4lab as fl
    res = fl.own.sweep(model, loss, batch, {"bf16": {"recipe": "bf16"},
                                            "nvfp4": {"recipe": "nvfp4"}},
                       fl.Config(steps=200), seeds=3, out="results/mine")
    res.runs                                     # the runs table, as fl.load("results/mine")
    fl.analysis.verdict(res.runs, "final_loss")

    records = fl.own.train(model, loss, batch, fl.Config(recipe="nvfp4"), seeds=3)

The functions follow the contract of an experiment file (`fp4lab.train.own`): `model(config,
rngs)`, `loss(model, batch)`, `batch(key, step)` (or `batch(config, key, step)`), optional
`eval_batch`, `floor` (the known optimum) and `tokens_per_step`. The seed streams keep their
meaning: init seeds the model, data the batches, quant the quantizer; seeds run in calls of
`seed_batch`, each seed bit-identical whichever seeds share its call.

What identifies the task in run ids (`task_hash`): the source of the functions and of every
function and class of their modules they reach by name, the source of the user's modules they
reach (a module, or a function or class of another module, read as a global: its file and
those of the user's modules it imports, `fp4lab.train.user_code`), and the values they hold in
a closure or reach as a global: arrays (in-memory data, JAX PRNG keys by their key data) by
their bytes, numbers, strings, and containers of them at any depth (lists, tuples, dicts,
sets, deques, dataclasses, objects of the user's classes: `_value`), their default arguments,
a `functools.partial`'s function and arguments; another library's function or class (a dtype
such as jnp.bfloat16, np.sin) by its qualified name; the same in every process (names in
sorted order, a set by its elements' digests, never in set order). An iterator or an open file
they read is refused by name (what it gives depends on when it is read): pass its content by
`data`, a {name: bytes, array or Path} the hash covers too. An object of another library's
class adds its type's name only, except values whose repr is their content (ranges,
fractions, decimals, dates and times, NumPy dtypes). So an edited function or other data gives
new runs, and a rerun of the same skips finished ones.

The task is registered in this process: the local executor computes it (workers and Ray need
an experiment file, which they load themselves).
"""

from __future__ import annotations

import array
import collections
import dataclasses
import enum
import functools
import hashlib
import inspect
import io
import sys
import tempfile
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fp4lab.sweep import runner
from fp4lab.sweep import store as results_store
from fp4lab.sweep.experiment import Cell, Experiment, ExperimentError, jsonable, seed_triples
from fp4lab.train import own, user_code
from fp4lab.train.config import Config, ConfigError, make

__all__ = ["Unhashable", "task", "task_hash", "train", "sweep"]


def task_hash(fns: Mapping[str, Any], data: Mapping[str, Any] | None = None) -> str:
    """sha256 (hex) of the functions' code closure and in-memory arrays, and of `data` (module
    docstring)."""
    digest = hashlib.sha256()
    seen: set[int] = set()
    for name in sorted(fns):
        digest.update(name.encode() + b"\0")
        _code(fns[name], digest, seen)
    for name in sorted(data or {}):
        digest.update(f"data:{name}".encode() + b"\0")
        _value(data[name], digest, seen)
    return digest.hexdigest()


def _code(obj, digest, seen: set[int]) -> None:
    if not isinstance(obj, types.FunctionType | type):
        _value(obj, digest, seen)  # a callable object (a partial: its function and arguments)
        return
    if id(obj) in seen:
        return
    seen.add(id(obj))
    try:
        digest.update(inspect.getsource(obj).encode())
    except (OSError, TypeError):  # no source (made at run time): its code object
        code = getattr(obj, "__code__", None)
        digest.update(repr((code.co_code, code.co_consts, code.co_names)).encode() if code else b"")
    fns = [obj] if isinstance(obj, types.FunctionType) else list(vars(obj).values())
    for fn in fns:
        fn = getattr(fn, "__func__", fn)
        if not isinstance(fn, types.FunctionType):
            continue
        # default arguments: values computed where the function was defined, not in its body
        # (the function's own tuple and dict: `seen` holds ids, so never a temporary here)
        for defaults in (fn.__defaults__, fn.__kwdefaults__):
            _value(defaults, digest, seen)
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            try:
                _reached(contents, None, digest, seen)
            except Unhashable as e:
                raise Unhashable(
                    f"{fn.__name__} holds {name!r} in its closure ({e}): its runs would get "
                    "no id of their own; pass what it gives by data= (bytes, an array or a "
                    "Path) or make it an array, number, string or container of them"
                ) from None
        for name in sorted(_names(fn.__code__)):  # not set order: it changes per process
            if name in fn.__globals__:
                try:
                    _reached(fn.__globals__[name], obj, digest, seen)
                except Unhashable as e:
                    raise Unhashable(
                        f"{fn.__name__} reads the global {name!r} ({e}): its runs would get "
                        "no id of their own; pass what it gives by data= (bytes, an array or a "
                        "Path) or make it an array, number, string or container of them"
                    ) from None


def _names(code) -> set[str]:
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _names(const)
    return out


def _reached(value, owner, digest, seen: set[int]) -> None:
    """A value a function reads: a function or class (its code where the function's module
    defines it; else the source of its module if that is the user's), a module (its source
    and that of the user's modules it imports, if it is the user's: `user_code`), an array, a
    number, a string or a container of them. Any other object adds its type's name only (its
    repr may hold an address)."""
    if isinstance(value, types.FunctionType | type):
        module = getattr(value, "__module__", None)
        if owner is None or module == owner.__module__:
            _code(value, digest, seen)
        elif module in sys.modules and user_code.module_file(sys.modules[module]) is not None:
            _module(sys.modules[module], digest, seen)
        else:  # another library's function or class (jnp.float32, np.sin): its name
            name = getattr(value, "__qualname__", getattr(value, "__name__", ""))
            digest.update(f"{module}.{name}".encode())
    elif isinstance(value, types.ModuleType):
        _module(value, digest, seen)
    else:
        _value(value, digest, seen)


def _module(module: types.ModuleType, digest, seen: set[int]) -> None:
    """The source of a module of the user's and of the user's modules it imports."""
    path = user_code.module_file(module)
    if path is None or id(module) in seen:
        return
    seen.add(id(module))
    source = path.read_bytes()
    package = module.__name__ if path.name == "__init__.py" else module.__name__.rpartition(".")[0]
    for name, file in {module.__name__: path, **user_code.imported(source, path, package)}.items():
        digest.update(f"module:{name}".encode() + b"\0" + file.read_bytes())


class Unhashable(ExperimentError):
    """A value the functions read whose content a run id cannot cover (an iterator, a file)."""


def _value(value, digest, seen: set[int]) -> None:
    """A value's content: numbers, strings, bytes, a file's bytes, arrays (dtype, shape,
    bytes), containers (lists, tuples, dicts, sets by their elements' digests, whatever their
    order), dataclasses and objects of the user's classes (their fields), functions (their
    code); an object of another library's class adds its type's name only. An iterator, a
    generator or an open file is refused (`Unhashable`): what it gives depends on when it is
    read."""
    if isinstance(value, bytes):
        digest.update(value)
    elif isinstance(value, Path) and value.is_file():
        digest.update(value.read_bytes())
    elif isinstance(value, str | int | float | complex | bool | type(None) | enum.Enum):
        digest.update(repr(value).encode())
    elif hasattr(value, "__array__") and not isinstance(value, type):
        a = _array(value)
        digest.update(f"{a.dtype}{a.shape}".encode() + np.ascontiguousarray(a).tobytes())
    elif isinstance(value, bytearray | memoryview | array.array):
        digest.update(type(value).__name__.encode() + bytes(value))
    elif isinstance(value, types.FunctionType | type):
        _code(value, digest, seen)
    elif isinstance(value, types.ModuleType):
        _module(value, digest, seen)
    elif isinstance(value, io.IOBase | Iterator):
        raise Unhashable(f"type {type(value).__qualname__}, read as it goes")
    elif isinstance(value, collections.deque):
        digest.update(b"deque")
        _value(list(value), digest, seen)
    elif isinstance(value, Mapping | list | tuple):  # as they always were: no type tag
        if id(value) in seen:  # met before (or a cycle): its content is in already
            digest.update(b"\0seen")
            return
        seen.add(id(value))
        if not isinstance(value, Mapping):
            for v in value:
                _value(v, digest, seen)
            return
        for k in sorted(value, key=repr):
            digest.update(repr(k).encode())
            _value(value[k], digest, seen)
    else:
        digest.update(type(value).__qualname__.encode())
        parts = _parts(value)
        if parts and id(value) not in seen:
            seen.add(id(value))
            digest.update(b"\0")
            for v in parts:
                _value(v, digest, seen)
        elif not parts and type(value).__module__ in _VALUE_MODULES:
            text = repr(value)  # a range, a Fraction, a timedelta, a dtype
            if " at 0x" not in text:  # not an address (an object() sentinel): other per run
                digest.update(text.encode())


# the modules whose values' repr is their content (no address, the same in every process)
_VALUE_MODULES = {"builtins", "fractions", "decimal", "datetime", "numpy", "numpy.dtypes"}


def _array(value) -> np.ndarray:
    """An array-like's content as a NumPy array; a JAX PRNG key by its key data."""
    if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(value))
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as e:
        raise Unhashable(f"type {type(value).__qualname__}, not readable as an array ({e})") from e


def _parts(value) -> list:
    """The values a set or an object holds (names as strings beside them), in an order that
    is the same in every process; [] for an object of another library's class."""
    if isinstance(value, set | frozenset):  # by each element's own digest: no set order
        return sorted(task_hash({}, {"": v}) for v in value)
    if isinstance(value, functools.partial):
        return [value.func, value.args, value.keywords]
    if dataclasses.is_dataclass(value):
        return [
            x for f in dataclasses.fields(value) for x in (f.name, getattr(value, f.name, None))
        ]
    where = type(value).__module__
    mine = where == "__main__" or user_code.module_file(sys.modules.get(where)) is not None
    if isinstance(value, types.SimpleNamespace) or mine:  # a script's, a notebook's, a module's
        fields = dict(getattr(value, "__dict__", {}))
        for name in getattr(type(value), "__slots__", ()):
            fields[name] = getattr(value, name, None)
        return [x for k in sorted(fields) for x in (k, fields[k])]
    return []


def task(
    model: Callable,
    loss: Callable,
    batch: Callable,
    *,
    eval_batch: Callable | None = None,
    floor: float | None = None,
    tokens_per_step: int | Callable | None = None,
    data: Mapping[str, Any] | None = None,
) -> str:
    """Registers the functions as a task in this process; returns its `task_file` name,
    "python:<task_hash>", for `Config(task="own", task_file=...)`."""
    ns = types.SimpleNamespace(model=model, loss=loss, batch=batch, eval_batch=eval_batch)
    ns.FLOOR, ns.TOKENS_PER_STEP = floor, tokens_per_step
    fns = {"model": model, "loss": loss, "batch": batch}
    fns |= {"eval_batch": eval_batch} if eval_batch is not None else {}
    fns |= {"tokens_per_step": tokens_per_step} if callable(tokens_per_step) else {}
    tokens = None if callable(tokens_per_step) else tokens_per_step
    extra = {"floor": floor, "tokens_per_step": tokens}
    name = own.PYTHON + task_hash(fns, (data or {}) | {"__numbers__": repr(extra)})
    own.register(name, ns)
    return name


def sweep(
    model: Callable,
    loss: Callable,
    batch: Callable,
    cells: Mapping[str, Mapping[str, Any]],
    config: Config | Mapping[str, Any] | None = None,
    *,
    seeds: Any = 3,
    out: str | Path,
    name: str = "own",
    progress: bool = True,
    **task_options,
) -> results_store.Results:
    """Trains the model in every cell for every seed into the results folder `out` (finished
    runs are skipped, so a rerun resumes) and returns `fp4lab.load(out)`.

    Args:
      model, loss, batch: the task (module docstring); `task_options` (eval_batch, floor,
        tokens_per_step, data) go to `task`.
      cells: {label: config overrides}, e.g. {"nvfp4": {"recipe": "nvfp4"}}.
      config: the base Config (or a dict of overrides of Config()).
      seeds: an int n, a per-stream dict or a list of (init, data, quant) triples, as an
        experiment file's `seeds` (`fp4lab.sweep.experiment.seed_triples`).
      out: the results folder (one experiment's: `name`).
      progress: show compiles, each seed's steps and an ETA on stderr, as `fp4lab run` does
        (`fp4lab.sweep.progress`).
    """
    experiment = _experiment(model, loss, batch, cells, config, seeds, name, task_options)
    # as `fp4lab run` shows a sweep: steps of every seed too
    runner.run_experiment(experiment, out, progress=progress, progress_every=None)
    return results_store.load(out)


def train(
    model: Callable,
    loss: Callable,
    batch: Callable,
    config: Config | Mapping[str, Any] | None = None,
    *,
    seeds: Any = 3,
    **task_options,
) -> list[dict[str, Any]]:
    """Trains one config for every seed; returns its run records, one dict per seed in the
    store's format (run_id, config, seeds, data, status, summary, series, telemetry, wall_s,
    provenance; `fp4lab.sweep.store`). Raises RuntimeError with the traceback of a run that
    failed."""
    with tempfile.TemporaryDirectory() as folder:
        experiment = _experiment(
            model, loss, batch, {"base": {}}, config, seeds, "own", task_options
        )
        runner.run_experiment(experiment, folder, progress=False)
        records = results_store.Store(folder).records()
    failed = [r for r in records if r["status"] != "ok"]
    if failed:
        raise RuntimeError(f"fp4lab.own.train: a run failed:\n{failed[0].get('error', '')}")
    order = {rid: i for i, rid in enumerate(experiment.cells[0].run_ids())}
    return sorted(records, key=lambda r: order[r["run_id"]])


def _experiment(model, loss, batch, cells, config, seeds, name, task_options) -> Experiment:
    if not isinstance(cells, Mapping) or not all(
        isinstance(k, str) and isinstance(v, Mapping) for k, v in cells.items()
    ):
        raise ExperimentError(
            f"cells={cells!r}; give {{label: config overrides}}, e.g. "
            '{"nvfp4": {"recipe": "nvfp4"}}'
        )
    task_file = task(model, loss, batch, **task_options)
    try:
        base = make(dict(config)) if isinstance(config, Mapping) else (config or Config())
        base = base.replace(task="own", task_file=task_file)
        built = []
        for label, overrides in cells.items():
            cfg = make(dict(overrides), base)
            data = results_store.data_hashes(cfg.to_dict())
            triples = seed_triples(seeds)
            built.append(Cell(label, jsonable(dict(overrides)), cfg, triples, "", data))
    except ConfigError as e:
        raise ExperimentError(str(e)) from e
    if not built:
        raise ExperimentError("cells is empty; give at least one {label: overrides}")
    return Experiment(name=name, path=f"{name}.py", base=base, cells=tuple(built))
