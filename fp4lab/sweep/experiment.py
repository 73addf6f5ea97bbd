"""Experiment files: the base config, the grid of cells and their seeds.

An experiment file is plain Python with two functions:

    def get_config():            # the base Config (or a dict of overrides of Config())
        return fl.Config(task="markov", steps=300, ...)

    def sweep(add):              # the grid: one add(...) per cell
        for recipe in ("bf16", "nvfp4"):
            add(recipe=recipe, seeds=4)

`add(label=None, seeds=None, **overrides)` adds a cell: the base config with `overrides`. `seeds`
is an int n (seeds 0..n-1, the same integer in every stream), a dict {"init": [...],
"data": [...], "quant": [...]} (the product of the lists; a missing stream is [0]), or a list
of (init, data, quant) triples; a seed lies in [0, 2**32) (`fp4lab.schema.SEED_LIMIT`). A
module-level `SEEDS` sets the default (else 1). An int moves the three streams together, so the
verdict cannot say which of them acts; `fp4lab.sweep.design.crossed()` crosses the quant stream
with the others (`fp4lab run --design streams` for every cell). Two cells of one config are an
error (one config, one label). Everything is validated when the file is loaded, before anything
runs; errors name the file, the line of the `add` call, the field and the allowed values. An
optional `analyze(results)` returns {name: DataFrame}: the experiment's own tables, which
`fp4lab run` prints and writes to `<out>/<name>.csv` once the sweep is done.

Recipes are names or values (`fp4lab.train.config`): the file can write its own,

    X = fl.nvfp4()
    MINE = fl.GemmRecipe(fprop_x=X, fprop_w=X, dgrad_dy=X.replace(rounding="stochastic"),
                         dgrad_w=X, name="nvfp4-dy-sr")       # Wgrad unquantized
    add(recipe=MINE)                                          # cell "recipe=nvfp4-dy-sr"
    add(recipe="nvfp4", gemms={"dgrad_dy": X})                # one operand of a named recipe

and the records and `experiment.json` hold them as plain JSON (`Config.to_dict`). A cell's
default label shows a recipe by its name (so name your recipes) and a spec by
`QuantSpec.summary` ("e2m1/1x16/e4m3/sr").

A cell that reads a data file (the text task's `text_path`) has the file's content hash in its
run ids (`fp4lab.sweep.store.data_hashes`): editing the file makes its runs new runs.

A file that defines `model(config, rngs)`, `loss(model, batch)` and `batch(key, step)` trains
its own model on its own data (`fp4lab.train.own`): its cells get task "own" and task_file the
file, and their run ids hash the file's source and its declared `DATA_FILES`.

Overrides for every cell (`load_experiment(path, overrides={"lr": 1e-3})`, from the command line
`fp4lab run FILE --set lr=1e-3`, parsed by `parse_overrides`) replace a field in the base config
and in every cell, the cells' own values for it included; they are validated like the file and,
as any config change, give other run ids.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import importlib.util
import itertools
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from fp4lab.core import recipes
from fp4lab.core.recipes import GemmRecipe
from fp4lab.core.spec import QuantSpec
from fp4lab.schema import SEED_LIMIT, STREAMS, did_you_mean
from fp4lab.sweep.store import config_id, data_hashes, run_ids
from fp4lab.train import own
from fp4lab.train.config import Config, ConfigError, jsonable, make

__all__ = [
    "Cell",
    "Experiment",
    "ExperimentError",
    "analyzed",
    "check_cells",
    "load_experiment",
    "parse_overrides",
    "seed_triples",
]


class ExperimentError(ValueError):
    """An experiment file that cannot run: where, which field, what is allowed."""


def analyzed(exp: Experiment, results, which: str = "") -> dict:
    """The experiment file's `analyze(results)`, checked: {name: DataFrame}, each name usable
    as a file name. Raises ExperimentError (naming the file, `which` runs, and what it raised
    or returned) where it raises or returns anything else."""
    runs = f" of the {which} runs" if which else ""
    try:
        tables = exp.analyze(results)
    except Exception as e:  # the user's function: one line, with what it raised
        raise ExperimentError(
            f"{exp.path}: analyze(results){runs} raised {type(e).__name__}: {e}"
        ) from e
    if not isinstance(tables, dict) or not all(
        isinstance(k, str) and k.isidentifier() and isinstance(v, pd.DataFrame)
        for k, v in tables.items()
    ):
        got = type(tables).__name__
        if isinstance(tables, dict):
            got = ", ".join(f"{k!r}: {type(v).__name__}" for k, v in tables.items())
        raise ExperimentError(
            f"{exp.path}: analyze(results){runs} returned {got}; it must return "
            "{name: DataFrame}, names usable as file names"
        )
    return tables


@dataclasses.dataclass(frozen=True)
class Cell:
    """One grid point: a resolved config and its seed triples (init, data, quant)."""

    label: str
    overrides: dict[str, Any]
    config: Config
    seeds: tuple[tuple[int, int, int], ...]
    where: str = ""  # file:line of the add() call
    data: dict[str, str] = dataclasses.field(default_factory=dict)  # data file hashes

    def run_ids(self) -> list[str]:
        """The run id of each seed triple (config, seeds, data hashes, numerics version),
        computed once per cell."""
        if "ids" not in self.__dict__:  # frozen: kept beside the fields, as cached_property does
            self.__dict__["ids"] = run_ids(self.config.to_dict(), self.seeds, self.data)
        return list(self.__dict__["ids"])


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    path: str
    base: Config
    cells: tuple[Cell, ...]
    # the file's optional analyze(results) -> {name: DataFrame}, run by `fp4lab run` at the end
    analyze: Callable | None = dataclasses.field(default=None, compare=False, repr=False)
    # the overrides for every cell (`--steps`, `--set`), as resolved in the base config
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)

    def manifest(self) -> dict[str, Any]:
        manifest = {
            "name": self.name,
            "file": Path(self.path).name,
            "path": _shown_path(self.path),
            "cells": [
                {"label": c.label, "overrides": c.overrides, "run_ids": c.run_ids()}
                for c in self.cells
            ],
        }
        if self.overrides:
            manifest["overrides"] = self.overrides
        return manifest

    @property
    def n_runs(self) -> int:
        return sum(len(c.seeds) for c in self.cells)


def _shown_path(path) -> str:
    """The experiment file's path as a manifest records it: relative to the working directory
    when the file lies under it (a results folder in a repository names no machine's paths),
    else absolute."""
    full = Path(path).resolve()
    try:
        return full.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(full)


def seed_triples(seeds) -> tuple[tuple[int, int, int], ...]:
    """Seed triples (init, data, quant) from an int, a per-stream dict or a list of triples."""
    if isinstance(seeds, bool):
        raise ExperimentError(f"seeds={seeds!r}; allowed: an int, a dict or a list of triples")
    if isinstance(seeds, int):
        if not 1 <= seeds <= SEED_LIMIT:
            raise ExperimentError(f"seeds={seeds}; must be >= 1 and <= {SEED_LIMIT}")
        return tuple((i, i, i) for i in range(seeds))
    if isinstance(seeds, dict):
        bad = sorted(set(seeds) - set(STREAMS))
        if bad:
            raise ExperimentError(f"seeds has unknown streams {bad}; allowed: {STREAMS}")
        lists = [list(seeds.get(s, [0])) for s in STREAMS]
        for s, values in zip(STREAMS, lists, strict=True):
            if not values or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in values
            ):
                raise ExperimentError(f"seeds[{s!r}]={values!r}; must be a non-empty list of ints")
        return _in_range(tuple(itertools.product(*lists)))
    try:
        triples = tuple(tuple(int(v) for v in t) for t in seeds)
    except (TypeError, ValueError):
        triples = ()
    if not triples or any(len(t) != 3 for t in triples):
        raise ExperimentError(
            f"seeds={seeds!r}; allowed: an int n, {{'init': [...], 'data': [...], "
            "'quant': [...]}, or a list of (init, data, quant) triples"
        )
    return _in_range(triples)


def _in_range(triples: tuple) -> tuple:
    """`triples`, if every seed is in [0, SEED_LIMIT) (a stream's key keeps a seed's low 32
    bits, so a seed outside would repeat the stream of one inside under another run id) and no
    triple comes twice (it would be one run, counted as two)."""
    twice = sorted((t, n) for t, n in collections.Counter(triples).items() if n > 1)
    if twice:
        (triple, n), *_ = twice
        raise ExperimentError(
            f"seeds: the triple {triple} comes {n} times; a triple is one run (the same seeds "
            "give the same bits), give each once"
        )
    for v in (v for t in triples for v in t):
        if not 0 <= v < SEED_LIMIT:
            raise ExperimentError(
                f"seed {v} is outside [0, {SEED_LIMIT - 1}]: a stream's key keeps a seed's low "
                f"32 bits, so it would repeat the stream of seed {v % SEED_LIMIT}"
            )
    return triples


def _label(overrides: dict[str, Any]) -> str:
    return ",".join(f"{k}={_brief(v)}" for k, v in overrides.items()) or "base"


def _brief(value) -> str:
    """A value as a cell label shows it: str(value), but with a GemmRecipe by its name and a
    QuantSpec by `QuantSpec.summary` (the record holds them in full)."""

    def values(v) -> bool:
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list | tuple):
            return any(values(x) for x in v)
        return isinstance(v, GemmRecipe | QuantSpec)

    def brief(v) -> str:
        if isinstance(v, GemmRecipe):
            return _recipe_label(v)
        if isinstance(v, QuantSpec):
            return v.summary()
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k!r}: {brief(x)}" for k, x in v.items()) + "}"
        if isinstance(v, list | tuple):
            inner = ", ".join(brief(x) for x in v)
            return f"[{inner}]" if isinstance(v, list) else f"({inner})"
        return repr(v)

    return brief(value) if values(value) else str(value)


def _recipe_label(recipe: GemmRecipe) -> str:
    """A GemmRecipe's name; one that differs from the registered recipe of its name (a
    `replace` keeps the name) says how: "nvfp4+outputs=e2m1/1x32/e8m0", "nvfp4+modified"."""
    name = recipe.name or "GemmRecipe(...)"
    registered = recipes.get(recipe.name) if recipe.name in recipes.names() else None
    if registered is None or registered == recipe:
        return name
    parts = [
        f"{field}={getattr(recipe, field).summary() if getattr(recipe, field) else None}"
        for field in ("norms", "outputs")
        if getattr(recipe, field) != getattr(registered, field)
    ]
    same = dataclasses.replace(recipe, norms=registered.norms, outputs=registered.outputs)
    if same != registered:
        parts.append("modified")
    return "+".join([name, *parts])


def _data(cfg: Config) -> dict[str, str]:
    try:
        return data_hashes(cfg.to_dict())
    except OSError as e:
        field = "task_file" if cfg.task == "own" else "text_path"
        raise ExperimentError(
            f"Config.{field}={getattr(cfg, field)!r}: cannot read a data file {e.filename!r} "
            f"({e.strerror})"
        ) from e


def _own_base(base: Config, module, path: Path) -> Config:
    """The base config of a file that brings its own model, loss and data (`fp4lab.train.own`):
    task "own", task_file the file (as the manifest shows its path)."""
    try:
        own.adopt(path, module)
    except own.OwnTaskError as e:
        raise ExperimentError(str(e)) from e
    if base.task not in ("markov", "own"):
        raise ExperimentError(
            f"{path}: defines model, loss and batch but get_config() sets task={base.task!r}; "
            "leave task out (the file's own task is used)"
        )
    return base.replace(task="own", task_file=_shown_path(path))


def load_experiment(
    path: str | Path,
    *,
    seeds: Any = None,
    steps: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> Experiment:
    """Loads and validates an experiment file.

    Args:
      path: the experiment file.
      seeds: the seeds of every cell instead of the file's: an int n (0..n-1), a per-stream
        dict or a list of triples (`fp4lab.sweep.design.crossed()`).
      steps: the number of steps of every cell (the same as overrides={"steps": steps}).
      overrides: {config field: value} for every cell: set in the base config and in each cell,
        replacing the cell's own value. Validated like the file's own values.
    Raises:
      ExperimentError: the file, a cell or an override is invalid (the message says where).
    """
    forced = dict(overrides or {})
    if steps is not None:
        if "steps" in forced and forced["steps"] != steps:
            raise ExperimentError(
                f"steps={steps} and overrides steps={forced['steps']!r}; give steps once"
            )
        forced["steps"] = steps
    path = Path(path)
    if not path.is_file():
        raise ExperimentError(f"{path}: no such experiment file")
    if path.suffix != ".py":
        raise ExperimentError(f"{path}: an experiment file is a Python file; name it *.py")
    own.beside(path)  # `from helper import X`, as under `python FILE`
    spec = importlib.util.spec_from_file_location(f"fp4lab_experiment_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise ExperimentError(f"{path}: the file raised {type(e).__name__}: {e}") from e
    for fn in ("get_config", "sweep"):
        if not callable(getattr(module, fn, None)):
            raise ExperimentError(
                f"{path}: defines no {fn}(); an experiment needs get_config() and sweep(add)"
            )
    try:
        base = module.get_config()
        base = make(base) if isinstance(base, dict) else base
    except ConfigError as e:
        raise ExperimentError(f"{path}: get_config(): {e}") from e
    except Exception as e:
        raise ExperimentError(f"{path}: get_config() raised {type(e).__name__}: {e}") from e
    if not isinstance(base, Config):
        raise ExperimentError(f"{path}: get_config() returned {type(base).__name__}; need Config")
    if own.defines_task(module):  # the file's own model, loss and data
        base = _own_base(base, module, path)
    if forced:
        try:
            base = make(forced, base)
        except ConfigError as e:
            raise ExperimentError(
                f"{path}: the overrides for every cell ({_label(forced)}): {e}"
            ) from e
        resolved = base.to_dict()
        forced = {k: resolved[k] for k in forced}
    default_seeds = getattr(module, "SEEDS", 1)
    forced_seeds = seeds
    cells: list[Cell] = []

    def add(label: str | None = None, *, seeds: Any = None, **overrides):
        frame = sys._getframe(1)
        here = Path(frame.f_code.co_filename).resolve() == path.resolve()
        where = f"{path}:{frame.f_lineno}" if here else str(path)
        try:
            for name in forced:  # the overrides for every cell replace the cell's own values
                overrides.pop(name, None)
            cfg = make(overrides, base)
            chosen = next(s for s in (forced_seeds, seeds, default_seeds) if s is not None)
            triples = seed_triples(chosen)
            data = _data(cfg)
        except (ConfigError, ExperimentError) as e:
            raise ExperimentError(f"{where}: cell {_label(overrides)}: {e}") from e
        # the record's and manifest's "overrides" are plain JSON: recipes and specs as dicts
        given = jsonable(overrides)
        cells.append(Cell(label or _label(overrides), given, cfg, triples, where, data))

    try:
        module.sweep(add)
    except ExperimentError:
        raise
    except Exception as e:
        raise ExperimentError(f"{path}: sweep(add) raised {type(e).__name__}: {e}") from e
    if not cells:
        raise ExperimentError(f"{path}: sweep(add) added no cells")
    labels = [c.label for c in cells]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        why = f" (the overrides {_label(forced)} replace the cells' own values)" if forced else ""
        raise ExperimentError(f"{path}: cells with the same label {dupes}{why}")
    _one_label_per_config(path, cells)
    name = getattr(module, "NAME", path.stem)
    analyze = getattr(module, "analyze", None)
    if analyze is not None and not callable(analyze):
        raise ExperimentError(f"{path}: analyze is {type(analyze).__name__}; need a function")
    return Experiment(
        name=name,
        path=str(path),
        base=base,
        cells=tuple(cells),
        analyze=analyze,
        overrides=forced,
    )


def _one_label_per_config(path: Path, cells: list[Cell]) -> None:
    """Raises when two cells have the same config (and data): their runs would be one
    experiment's runs under two labels."""
    seen: dict[str, Cell] = {}
    for cell in cells:
        first = seen.setdefault(config_id(cell.config.to_dict(), cell.data), cell)
        if first is not cell:
            raise ExperimentError(
                f"{path}: cells {first.label!r} ({first.where or '?'}) and {cell.label!r} "
                f"({cell.where or '?'}) have the same config; give one cell all its seeds"
            )


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """{field: value} from `FIELD=VALUE` strings, as `fp4lab run --set` takes them.

    Each value is parsed into its field's type: a string field takes the text as it is (quotes
    optional); a bool field takes true/false (any case); any other field a Python literal
    (`1e-3`, `128`, `(64, 64)`, `{"wgrad": "bf16"}`, `None`), else the text itself, which the
    config then rejects naming the field and the type it needs. `load_experiment(...,
    overrides=...)` checks the values.

    Raises:
      ExperimentError: an item without "=", a field Config does not have (with the closest
        names), or a field given twice.
    """
    fields = {f.name: f.default for f in dataclasses.fields(Config)}
    out: dict[str, Any] = {}
    for item in items:
        name, eq, text = item.partition("=")
        name = name.strip()
        if not eq or not name:
            raise ExperimentError(f"--set {item!r}: expected FIELD=VALUE, e.g. --set lr=1e-3")
        if name not in fields:
            hint = did_you_mean(name, fields) or f"; the fields: {', '.join(fields)}"
            raise ExperimentError(f"--set {item}: Config has no field {name!r}{hint}")
        if name in out:
            raise ExperimentError(f"--set {item}: {name} is already set ({name}={out[name]!r})")
        out[name] = _parse_value(text, fields[name])
    return out


def _parse_value(text: str, default: Any) -> Any:
    """A `--set` value in the type of a field whose default is `default`."""
    if isinstance(default, bool) and text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text
    if isinstance(default, str) and not isinstance(value, str):
        return text  # a string field: `--set text_path=2024` is the file "2024"
    return value


def check_cells(cells: Iterable[Cell], check: Callable[[Config], str | None]) -> None:
    """Raises ExperimentError (one line: where, which cell, why) for the first cell whose run
    would fail at its start: `check` (`fp4lab.sweep.compute.check_cell`, which traces it)
    gives the reason."""
    for cell in cells:
        if why := check(cell.config):
            raise ExperimentError(f"{cell.where}: cell {cell.label} would fail: {why}")
