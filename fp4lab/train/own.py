"""Your own model, loss and data as a task: the contract, where a run finds it, what identifies it.

An experiment file (or a namespace handed to `fp4lab.own`) brings three functions:

    def model(config, rngs: nnx.Rngs) -> nnx.Module   the init stream seeds rngs (`rngs.params`)
    def loss(model, batch) -> jax.Array               the mean loss of a batch (a scalar)
    def batch(key, step) -> pytree                    the training batch of a step; key: the data
                                                      stream folded with the step
    def batch(config, key, step) -> pytree            ... the same, with the config first

and may add

    def eval_batch(key, i) -> pytree    held-out batch i (default: `batch` on held-out keys, which
                                        are disjoint from the training draws); `config` first too
    FLOOR = 0.0                         the known optimum of the loss (runs report loss_gap to it)
    TOKENS_PER_STEP = 512               tokens (or examples) a step consumes, or a function of the
                                        config (default: batch_size)
    DATA_FILES = ("tokens.npy",)        files the code reads, relative to the file's folder

The quant stream seeds the quantizer as in every run. All of it runs inside the compiled,
vmapped training loop: the functions must be traceable by jax (no Python side effects per step).

A Config names the task by `task="own"` and `task_file`: the experiment file's path, or
"python:<hash>" for functions registered in this process (`register`, what `fp4lab.own` does).
The path itself is not part of a run's id; the content hashes are (`hashes`): the file's
source and each of its `DATA_FILES`, or the hash in a "python:" name (of the functions' code and
their data, `fp4lab.own`). Editing the file or a data file makes its runs new runs.

Only the standard library is imported here: the sweep's host side loads experiment files with it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import math
import sys
from pathlib import Path
from typing import Any

from fp4lab.train import user_code

__all__ = [
    "CONTRACT",
    "OPTIONAL",
    "OwnTaskError",
    "adopt",
    "check",
    "defines_task",
    "hashes",
    "namespace",
    "register",
    "takes_config",
    "floor_of",
    "tokens_per_step",
]

CONTRACT = ("model", "loss", "batch")
OPTIONAL = ("eval_batch", "FLOOR", "TOKENS_PER_STEP", "DATA_FILES")
PYTHON = "python:"  # task_file prefix of functions registered in this process

_NAMESPACES: dict[str, Any] = {}  # task_file -> its namespace (a module or an object)


class OwnTaskError(ValueError):
    """A user task that cannot run: which function or name is missing or wrong."""


def defines_task(ns: Any) -> bool:
    """Whether `ns` (a module) brings its own task: any of model, loss, batch defined."""
    return any(callable(getattr(ns, name, None)) for name in CONTRACT)


def check(ns: Any, where: str) -> None:
    """Raises OwnTaskError naming what `ns` lacks or gets wrong of the contract."""
    missing = [n for n in CONTRACT if not callable(getattr(ns, n, None))]
    if missing:
        raise OwnTaskError(
            f"{where}: defines {', '.join(n for n in CONTRACT if n not in missing)} but not "
            f"{', '.join(missing)}; a task of your own needs model(config, rngs), loss(model, "
            "batch) and batch(key, step)"
        )
    eval_batch = getattr(ns, "eval_batch", None)
    if eval_batch is not None and not callable(eval_batch):
        raise OwnTaskError(f"{where}: eval_batch is {type(eval_batch).__name__}; need a function")
    for name in ("batch", "eval_batch"):
        if callable(getattr(ns, name, None)):
            check_signature(getattr(ns, name), name, where)
    for name in ("FLOOR", "TOKENS_PER_STEP"):
        value = getattr(ns, name, None)
        if name == "TOKENS_PER_STEP" and callable(value):
            continue
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise OwnTaskError(f"{where}: {name}={value!r}; need a number")
        if name == "TOKENS_PER_STEP" and value is not None:
            _whole(value, f"{where}: TOKENS_PER_STEP")
    data_files(ns, where)


def _whole(value, what: str) -> int:
    """`value` as a positive whole number of tokens, or OwnTaskError naming `what`."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not (value >= 1 and float(value).is_integer()):
        raise OwnTaskError(
            f"{what}={value!r}; need a positive whole number (the tokens or examples one step "
            "consumes)"
        )
    return int(value)


def tokens_per_step(ns: Any, config) -> int:
    """The task's tokens (or examples) per step: TOKENS_PER_STEP, a number or a function of the
    config, else the config's batch size; OwnTaskError where it is not a positive whole
    number."""
    value = getattr(ns, "TOKENS_PER_STEP", None)
    if value is None:
        return config.batch_size
    if not callable(value):
        return _whole(value, "TOKENS_PER_STEP")
    try:
        got = value(config)
    except Exception as e:  # the user's function: said with its name
        raise OwnTaskError(f"TOKENS_PER_STEP(config) raised {type(e).__name__}: {e}") from e
    return _whole(got, "TOKENS_PER_STEP(config)")


def data_files(ns: Any, where: str) -> tuple[str, ...]:
    files = getattr(ns, "DATA_FILES", ())
    if isinstance(files, str) or not all(isinstance(f, str) for f in files):
        raise OwnTaskError(f"{where}: DATA_FILES={files!r}; need a tuple of file names")
    return tuple(files)


def takes_config(fn) -> bool:
    """Whether a batch function takes the config first (three parameters, not two)."""
    return len(_positional(fn)) >= 3


def _positional(fn) -> list:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def check_signature(fn, name: str, where: str) -> None:
    """Raises OwnTaskError when `fn` (batch or eval_batch) reads two ways: two required
    positional parameters and a defaulted third (`batch(key, step, batch_size=64)`) is
    `batch(key, step)` with the third at its default, or `batch(config, key, step)`."""
    params = _positional(fn)
    required = [p for p in params if p.default is p.empty]
    if len(params) < 2 and not _variadic(fn):
        shown = ", ".join(str(p) for p in params)
        raise OwnTaskError(
            f"{where}: {name}({shown}) takes {len(params)} positional parameter(s); fp4lab calls "
            f"{name}(key, step) or {name}(config, key, step)"
        )
    if len(params) >= 3 and len(required) < 3:
        shown = ", ".join(str(p) for p in params)
        raise OwnTaskError(
            f"{where}: {name}({shown}) reads two ways: as {name}({params[0].name}, "
            f"{params[1].name}) with {params[2].name} at its default, or as {name}(config, key, "
            f"step) with the config passed as {params[0].name!r}; fp4lab would call it the "
            f"second way. Make it one: {name}(key, step) (give {params[2].name} no parameter "
            f"slot, e.g. a keyword-only `*, {params[2]}`) or {name}(config, key, step)"
        )


def _variadic(fn) -> bool:
    """Whether `fn` takes *args (any number of positional arguments)."""
    try:
        kinds = [p.kind for p in inspect.signature(fn).parameters.values()]
    except (TypeError, ValueError):  # no signature to read: nothing to say
        return True
    return inspect.Parameter.VAR_POSITIONAL in kinds


def floor_of(ns: Any) -> float:
    value = getattr(ns, "FLOOR", None)
    return math.nan if value is None else float(value)


def register(task_file: str, ns: Any) -> None:
    """Makes `ns` the task of configs whose `task_file` is `task_file`, in this process."""
    check(ns, task_file)
    _NAMESPACES[task_file] = ns


def namespace(task_file: str) -> Any:
    """The namespace of a config's `task_file`: registered in this process, else the file
    loaded (once per process and content)."""
    if task_file in _NAMESPACES:
        return _NAMESPACES[task_file]
    if task_file.startswith(PYTHON):
        raise OwnTaskError(
            f"task_file={task_file!r}: functions registered in another process; a task given as "
            "Python functions runs in the process that defined it (use an experiment file for "
            "worker processes and Ray)"
        )
    path = Path(task_file)
    if not path.is_file():
        raise OwnTaskError(f"task_file={task_file!r}: no such file")
    key = _file_key(path)
    if key not in _NAMESPACES:
        beside(path)  # a worker process: the file imports its neighbours here too
        spec = importlib.util.spec_from_file_location(f"fp4lab_own_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        check(module, str(path))
        _NAMESPACES[key] = module
    return _NAMESPACES[key]


def beside(path: str | Path) -> None:
    """Puts the folder of a user's file first on `sys.path` (once per process), as `python
    FILE` does, so that the file can import a module beside it (`from helper import X`); in
    the process that loads the experiment and in each worker that loads its task. A module
    name is one per process: two files that import different `helper.py`s share the first."""
    folder = str(Path(path).resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)


def adopt(path: str | Path, module: Any) -> None:
    """Keeps `module`, the file at `path` as already loaded (by the experiment loader), as
    that file's namespace in this process, so computing its cells does not run it again."""
    check(module, str(path))
    _NAMESPACES[_file_key(Path(path))] = module


def _file_key(path: Path) -> str:
    return f"{path.resolve()}@{hashlib.sha256(path.read_bytes()).hexdigest()}"


def hashes(task_file: str) -> dict[str, str]:
    """{name: sha256} of what a user task's numbers depend on besides its config: the file's
    source ("task_file"), each of its DATA_FILES ("data:<name>") and the source of each of
    the user's modules it imports ("module:<name>", `fp4lab.train.user_code.imported`), read
    without running the file (DATA_FILES must be a literal); or the hash a "python:" name
    carries.

    Raises:
      OSError: a file cannot be read.
    """
    if task_file.startswith(PYTHON):
        return {"task_file": task_file[len(PYTHON) :]}
    path = Path(task_file)
    source = path.read_bytes()
    out = {"task_file": hashlib.sha256(source).hexdigest()}
    for name in _literal_data_files(source, task_file):
        out[f"data:{name}"] = hashlib.sha256((path.parent / name).read_bytes()).hexdigest()
    for name, file in user_code.imported(source, path).items():  # the user's own modules
        out[f"module:{name}"] = hashlib.sha256(file.read_bytes()).hexdigest()
    return out


def _literal_data_files(source: bytes, where: str) -> tuple[str, ...]:
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "DATA_FILES" for t in targets):
            try:
                files = ast.literal_eval(node.value)
            except ValueError as e:
                raise OwnTaskError(f"{where}: DATA_FILES must be a literal tuple of names") from e
            return data_files(type("ns", (), {"DATA_FILES": files}), where)
    return ()
