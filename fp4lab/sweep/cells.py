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
from collections.abc import Mapping
from typing import Any

__all__ = ["checked"]


def checked(manifest: dict[str, Any] | None, made: Mapping[str, tuple]) -> list[dict[str, Any]]:
    """The manifest's cells, [{"label", "run_ids"}] in its order, each with the run ids its label
    pools: those without a record (missing) and those whose record agrees with the label (see
    the module docstring). Warns once per cell that lists runs it does not pool.

    Args:
      manifest: the folder's experiment.json (None: no cells).
      made: {run id: (the cell its record names, the id of its config, ...)} of the folder's
        runs (any of them; those the manifest lists are checked), as `Store.made` gives them.
    """
    cells = [
        (c.get("label", "?"), list(dict.fromkeys(c["run_ids"])))
        for c in (manifest or {}).get("cells", [])
    ]
    listed = {rid for _, ids in cells for rid in ids}
    by_id = {rid: v[:2] for rid, v in made.items() if rid in listed}  # in `made`'s order (ties)
    made_as: dict[str | None, Counter] = {}  # recorded label -> the config ids of the listed runs
    for (cell, key), n in Counter(by_id.values()).items():
        made_as.setdefault(cell, Counter())[key] += n
    out, taken = [], set()
    for label, ids in cells:
        found = [v for v in map(by_id.get, ids) if v is not None]
        own = Counter(key for cell, key in found if cell == label)
        votes = own or made_as.get(label) or Counter(key for _, key in found)
        config = votes.most_common(1)[0][0] if votes else None
        keep, other, twice = [], [], []
        for rid in ids:
            if rid in taken:
                twice.append(rid)
            elif rid in by_id and by_id[rid][1] != config:
                other.append(rid)
            else:
                keep.append(rid)
        taken.update(keep)
        if other or twice:
            _warn(label, other, twice, by_id)
        out.append({"label": label, "run_ids": keep})
    return out


def _warn(label: str, other: list[str], twice: list[str], by_id: dict[str, tuple]) -> None:
    parts = []
    if other:
        made = sorted({str(by_id[rid][0]) for rid in other})
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
