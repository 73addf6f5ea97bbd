"""Reproducing one stored run, bit for bit, outside the sweep.

    import fp4lab as fl
    fresh = fl.sweep.reproduce("results/quickstart", run_id)   # raises unless every bit matches

A sweep runs a cell's seeds in calls of at most `config.seed_batch` seeds
(`fp4lab.sweep.compute`). On the CPU, a run of `Config.pad_seeds=False` (the default) ran one
seed after the other in its call, so its numbers are those of the seed alone:
`jax.jit(fl.make_train(cfg))(fl.make_keys(*seeds))` gives them (tested). A run
recorded with `pad_seeds=True` (every run recorded before the field) sat in a vmapped call of
width `seed_batch`, whose XLA kernels depend on the width, so the seed alone is *not* that run
(its last bits differ, and a long run drifts); the same call of width `seed_batch`, padded with
copies of the seed, is. `reproduce` therefore reruns the stored config and seed triple through
`compute_cell`, the function the sweep itself used, which does either, and compares every
per-step series, every telemetry value and every summary number with the record.

By hand: `compute_cell(record["config"], [seed triple])` gives the same numbers, provided the
data files have the hashes in the record and `NUMERICS_VERSION` is the record's.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from fp4lab.sweep import store as results_store
from fp4lab.sweep.compute import compute_cell
from fp4lab.sweep.experiment import ExperimentError

__all__ = ["ReproductionError", "reproduce"]

_TIMINGS = ("compile_s", "wall_s")  # host timings, never reproducible
# judgements of a run's numbers, not numbers of it: their rule may change (the noise rule of
# `learned` came 2026-12-07) while the numbers stay bit for bit
_JUDGEMENTS = ("learned",)


class ReproductionError(ExperimentError):
    """A stored run that cannot be reproduced here, or whose numbers came out different."""


def reproduce(folder: str | os.PathLike, run_id: str, *, check: bool = True) -> dict[str, Any]:
    """Recomputes run `run_id` of the results folder `folder` exactly as the sweep did.

    Args:
      folder: a results folder.
      run_id: the id of one of its runs (current or stale).
      check: compare the fresh numbers with the record and raise on the first difference.
    Returns:
      The fresh result: {"summary", "series", "telemetry", "wall_s"}, as the record stores it,
      and "cpu", this host's (`fp4lab.sweep.provenance.cpu`).
    Raises:
      ReproductionError: no valid record with that id; a data file whose content changed; a
        record of another numerics version; or (with `check`) a number that differs.
    """
    store = results_store.Store(folder)
    record = store.read(run_id)
    if record is None:
        raise ReproductionError(f"{store.file(run_id)}: no valid record of run {run_id!r}")
    if record.get("numerics", 1) != results_store.NUMERICS_VERSION:  # schema 1 records: version 1
        raise ReproductionError(
            f"run {run_id} was made with numerics version {record.get('numerics')!r}; this fp4lab "
            f"computes version {results_store.NUMERICS_VERSION}, so its numbers differ on purpose"
        )
    try:
        data = results_store.data_hashes(record["config"])
    except OSError as e:
        raise ReproductionError(f"run {run_id}: cannot read its data file ({e})") from e
    stored = record.get("data") or {}
    if data.get("numerics_route") != stored.get("numerics_route"):
        routes = [d.get("numerics_route", "kernels") for d in (stored, data)]
        raise ReproductionError(
            f"run {run_id} was computed by the numerics route {routes[0]!r} (CPU kernels or "
            f"not) and this process computes by {routes[1]!r}, so its bits may differ"
        )
    if data != stored:
        raise ReproductionError(f"run {run_id}: its data file changed since the run ({data})")
    seeds = tuple(record["seeds"][s] for s in ("init", "data", "quant"))
    (fresh,) = compute_cell(record["config"], [seeds])
    if check:
        try:
            _compare(run_id, record, fresh)
        except ReproductionError as e:
            raise ReproductionError(f"{e}{_host_hint(record, fresh['cpu'])}") from None
    return fresh


def _host_hint(record: dict, here: str) -> str:
    """Why numbers may differ although code, versions and seeds agree: the CPU (`here`: the
    one that recomputed the run). XLA's CPU kernels pick their vector code by the instruction
    set, and their sums' order with it."""
    prov = record.get("provenance") or {}
    if prov.get("backend") not in (None, "cpu"):
        return ""
    made = prov.get("cpu")
    if made == here:
        return ""
    where = f"made on {made}" if made else "made on a CPU its record does not name"
    return (
        f" (the run was {where}; this is {here}. XLA's CPU kernels choose their vector code, "
        "and so the order of their sums, by the instruction set: a run reproduces bit for bit "
        "on the same kind of CPU)"
    )


def _equal(a, b) -> bool:
    if isinstance(a, dict) or isinstance(b, dict):
        return isinstance(a, dict) and isinstance(b, dict) and _dicts_equal(a, b)
    if a is None or b is None or isinstance(a, str) or isinstance(b, str):
        return a == b
    try:
        x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    except (TypeError, ValueError):
        return a == b
    return x.shape == y.shape and bool(np.array_equal(x, y, equal_nan=True))


def _dicts_equal(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(_equal(a[k], b[k]) for k in a)


def _compare(run_id: str, record: dict, fresh: dict) -> None:
    """Raises ReproductionError naming the first value that differs. An output the record does
    not have (a newer summary field, e.g. eval_hp in records older than it) is not compared;
    one the record has and the fresh run lacks is a difference."""
    for part in ("series", "telemetry", "summary"):
        stored, new = record.get(part) or {}, fresh.get(part) or {}
        if part == "summary":
            stored = {k: v for k, v in stored.items() if k not in (*_TIMINGS, *_JUDGEMENTS)}
            new = {k: v for k, v in new.items() if k not in (*_TIMINGS, *_JUDGEMENTS)}
        for key in sorted(stored):
            if not _equal(stored.get(key), new.get(key)):
                a, b = stored.get(key), new.get(key)
                show = f"{a} vs {b}" if _scalar(a) and _scalar(b) else "arrays differ"
                raise ReproductionError(f"run {run_id}: {part}[{key!r}] differs: {show}")


def _scalar(v) -> bool:
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool))
