"""The manifest's cells checked against the run records: which runs each label pools.

`experiment.json` lists each cell's label and run ids; each run's record holds the label it was
made under and its config. A label stands for one config, and the records say which: the config
of the cell's own runs recorded under its label, else of the listed runs recorded under it in
another cell (two labels swapped by hand), else the one most of its runs share (a label renamed
in the experiment file keeps its runs). A listed run of another config, or one listed already
under an earlier cell, is not pooled under the label (one warning per cell): it counts in no
cell, and `fp4lab show --stale` shows it with its config id. `fp4lab ls` and `fp4lab show` count
the same runs.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

__all__ = ["checked"]


def checked(
    manifest: dict[str, Any] | None,
    records: list[dict[str, Any]],
    config_id: Callable[[dict[str, Any], dict[str, str] | None], str],
) -> list[dict[str, Any]]:
    """The manifest's cells, [{"label", "run_ids"}] in its order, each with the run ids its label
    pools: those without a record (missing) and those whose record agrees with the label (see
    the module docstring). Warns once per cell that lists runs it does not pool.

    Args:
      manifest: the folder's experiment.json (None: no cells).
      records: the folder's run records (any of them; those the manifest lists are checked).
      config_id: (config, data hashes) -> the id of a run's config (`fp4lab.sweep.store`).
    """
    cells = [
        (c.get("label", "?"), list(dict.fromkeys(c["run_ids"])))
        for c in (manifest or {}).get("cells", [])
    ]
    listed = {rid for _, ids in cells for rid in ids}
    by_id = {r["run_id"]: r for r in records if r["run_id"] in listed}
    key = {rid: config_id(r["config"], r.get("data")) for rid, r in by_id.items()}
    made_as: dict[str, Counter] = {}  # recorded label -> the config ids of the listed runs
    for rid, r in by_id.items():
        made_as.setdefault(r.get("cell"), Counter())[key[rid]] += 1
    out, taken = [], set()
    for label, ids in cells:
        own = Counter(key[rid] for rid in ids if rid in by_id and by_id[rid].get("cell") == label)
        votes = own or made_as.get(label) or Counter(key[rid] for rid in ids if rid in by_id)
        config = votes.most_common(1)[0][0] if votes else None
        keep, other, twice = [], [], []
        for rid in ids:
            if rid in taken:
                twice.append(rid)
            elif rid in by_id and key[rid] != config:
                other.append(rid)
            else:
                keep.append(rid)
        taken.update(keep)
        if other or twice:
            _warn(label, other, twice, by_id)
        out.append({"label": label, "run_ids": keep})
    return out


def _warn(label: str, other: list[str], twice: list[str], by_id: dict[str, dict]) -> None:
    parts = []
    if other:
        made = sorted({str(by_id[rid].get("cell")) for rid in other})
        parts.append(
            f"{len(other)} runs of another config (recorded as cell {', '.join(made)}; e.g. "
            f"{other[0]})"
        )
    if twice:
        parts.append(f"{len(twice)} runs an earlier cell lists (e.g. {twice[0]})")
    warnings.warn(
        f"experiment.json: cell {label!r} lists {' and '.join(parts)}; not pooled under it "
        "(a hand-edited manifest? `fp4lab run` rewrites it)",
        stacklevel=3,
    )
