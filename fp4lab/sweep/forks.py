"""Forks: a stored run restarted at step S under one change, everything else the same.

Su et al. 2025 (arXiv 2506.20752) switch precision in situ, from a checkpoint shortly before a
loss spike, to see whether the change averts it. fp4lab has no checkpoints to load: a fork is
a run of its own, the parent's config with one more precision phase from step S
(`Config.phases`), on the parent's seeds. Its first S steps are the parent's, bit for bit
(tests/sweep/test_forks.py): the same program computes them, and a phase boundary changes no
number before it. A change is a phase's dict, read against the parent:

    {"recipe": "bf16"}              the whole model to BF16 (norm vectors too)
    {"gemms": {"wgrad": "bf16"}}    one GEMM kind (merged into the parent's gemms)
    {"gemms": {"norms": None}}      the norm layers' vectors back to high precision
    {"rules": ((r"blocks\\.3\\..*", "bf16"),)}   one layer (before the parent's rules)
    {"lr_scale": 0.5}               half the learning rate
    {}                              nothing but the quantization stream: a phase draws its
                                    keys from fold_in(quant, phase), so from S on the quant
                                    noise is redrawn (a deterministic recipe: the parent
                                    again, bit for bit)

Every phase draws its quant keys from its own fold_in(quant, phase), so a fork of a recipe
that rounds stochastically also redraws the noise from S on, whatever its change: the `{}`
fork measures what the redraw alone does.

`fork_cells(parent, before=k, changes=...)` lists one fork per (run with a spike event,
change), taken k steps before the run's first event; `add_forks(add, ...)` adds them to an
experiment file's sweep, each labelled "<change> @ <parent run id>", so the fork's record keeps
its parent's id. Two runs of one parent cell whose first events fall on the same step have forks
of one config (on their own seeds): those share a cell, "<change> @ <id>+<id>", one run per
parent; `parent_of_run` finds a fork run's parent by its seeds.
`fp4lab.analysis.instability.fork_outcomes` gives the shares averted.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from fp4lab.schema import SEED_COLUMNS
from fp4lab.sweep.store import Store, load

__all__ = ["Fork", "fork_cells", "add_forks", "parent_of", "parent_of_run"]

_SEP = " @ "
_JOIN = "+"  # between the parents of one fork cell (run ids are hex)


@dataclasses.dataclass(frozen=True)
class Fork:
    """One fork: its cell label, the parent's seeds, its config (the parent's plus a phase),
    the parent's run id and cell, its first event step and the fork's step."""

    label: str
    seeds: tuple[int, int, int]
    config: dict[str, Any]
    parent: str
    parent_cell: str
    event: int
    step: int
    change: str


def parent_of(label: str) -> tuple[str, str]:
    """(change name, parent run id) of a fork's cell label (ids joined by "+" where the cell
    holds the forks of several parents: `parent_of_run` picks a run's own)."""
    change, sep, parent = label.rpartition(_SEP)
    if not sep:
        raise ValueError(f"{label!r} is not a fork's label ('<change>{_SEP}<parent run id>')")
    return change, parent


def parent_of_run(label: str, seeds: Sequence[int], parents: pd.DataFrame) -> tuple[str, str]:
    """(change name, parent run id) of one fork run: of its cell's parents (`parent_of`), the
    one whose seeds (init, data, quant) are the run's. `parents`: the parent study's runs table.

    Raises:
      ValueError: not a fork's label, or no parent of the label has these seeds.
    """
    change, ids = parent_of(label)
    rows = parents[parents["run_id"].isin(ids.split(_JOIN))]
    match = rows[(rows[list(SEED_COLUMNS)] == [int(s) for s in seeds]).all(axis=1)]
    if len(match) != 1:
        raise ValueError(f"{label!r}: no parent run with seeds {tuple(seeds)} in {ids}")
    return change, str(match["run_id"].iloc[0])


def fork_cells(
    parent: str | os.PathLike,
    *,
    changes: Mapping[str, Mapping[str, Any]],
    before: int = 50,
    cells: Sequence[str] | None = None,
    first: int | None = None,
) -> list[Fork]:
    """The forks of a results folder's runs: for every finished run (of `cells`, default all)
    with a spike event at step E >= before + 1, one fork per change from step E - before.

    Args:
      parent: the parent study's results folder.
      changes: {name: phase change} (module docstring); a name may not hold " @ ".
      before: steps between the fork and the event (>= 1).
      cells: the parent's cell labels to fork (default: every cell).
      first: fork only the first this many such runs (by init, data, quant seed).
    Raises:
      ValueError: a bad argument, an unknown cell, or a parent run whose own phases start at
        or after its fork step.
    """
    if isinstance(before, bool) or not isinstance(before, int) or before < 1:
        raise ValueError(f"fork_cells: before={before!r}; must be an int >= 1")
    if not changes:
        raise ValueError("fork_cells: no changes given")
    for name, change in changes.items():
        if _SEP in name or not isinstance(change, Mapping):
            raise ValueError(f"fork_cells: change {name!r}: a name without {_SEP!r} and a dict")
    runs = load(parent, metrics=False).runs
    if cells is not None:
        unknown = sorted(set(cells) - set(runs["cell"]))
        if unknown:
            raise ValueError(f"fork_cells: no cells {unknown} in {parent}")
        runs = runs[runs["cell"].isin(cells)]
    store = Store(parent)
    out = []
    runs = runs[(runs["status"] == "ok") & (runs["first_spike"] >= before + 1)]
    runs = runs.sort_values(["seed_init", "seed_data", "seed_quant"])
    for row in runs.head(len(runs) if first is None else first).itertuples():
        event = row.first_spike
        record = store.read(row.run_id, metrics=False)
        config = dict(record["config"])
        step = int(event) - before
        seeds = (int(row.seed_init), int(row.seed_data), int(row.seed_quant))
        for name, change in changes.items():
            out.append(
                Fork(
                    label=f"{name}{_SEP}{row.run_id}",
                    seeds=seeds,
                    config=_forked(config, step, change, row.run_id),
                    parent=row.run_id,
                    parent_cell=row.cell,
                    event=int(event),
                    step=step,
                    change=name,
                )
            )
    store.close()
    return out


def add_forks(add: Callable, parent: str | os.PathLike, **kwargs) -> list[Fork]:
    """`fork_cells(parent, **kwargs)` added to an experiment file's sweep with `add`: a cell per
    fork, or per set of forks of one config (parents of one config forked at one step, on
    their own seeds: "<change> @ <id>+<id>")."""
    forks = fork_cells(parent, **kwargs)
    same: dict[str, list[Fork]] = {}
    for f in forks:
        same.setdefault(json.dumps(f.config, sort_keys=True, default=str), []).append(f)
    for group in same.values():
        label = f"{group[0].change}{_SEP}{_JOIN.join(f.parent for f in group)}"
        add(label, seeds=[f.seeds for f in group], **group[0].config)
    return forks


def _forked(config: dict[str, Any], step: int, change: Mapping[str, Any], rid: str) -> dict:
    """The parent's config dict with the change as a phase from `step`."""
    phases = [list(p) for p in config.get("phases", [])]
    starts = [p[0] if p[0] >= 1 else round(p[0] * config["steps"]) for p in phases]
    if starts and max(starts) >= step:
        raise ValueError(
            f"run {rid}: its own phases start at {starts}, at or after the fork's step {step}"
        )
    phase = dict(change)
    if "gemms" in phase:  # merged into the parent's: one thing changes
        phase["gemms"] = dict(config.get("gemms", [])) | dict(phase["gemms"])
    if "rules" in phase:  # before the parent's: they win where they match
        phase["rules"] = [*phase["rules"], *config.get("rules", [])]
    return config | {"phases": [*phases, [step, phase]]}
