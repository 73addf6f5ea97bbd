"""Why the verdict does not judge, or judges with a caveat: in words a reader can act on.

    not_learned            a cell some of whose runs' training loss did not fall by more than
                           its batch-to-batch noise (`learned` False)
    confounded             streams whose seeds moved together (a factor "init=data=quant"):
                           which of them acts cannot be said; the design that separates them
    missing_combinations   an unbalanced cell: the seed combinations missing or run twice

The seed designs named here live in `fp4lab.sweep.design` (analysis does not import the sweep):
`seeds=fl.design.crossed()` crosses the quant stream with init=data, 3 levels each.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from fp4lab.analysis import crossed
from fp4lab.schema import STREAMS

__all__ = ["confounded", "missing_combinations", "not_learned"]


def not_learned(rows: pd.DataFrame) -> str:
    """ "2 of 3 runs: the training loss did not fall by more than its batch-to-batch noise" (and
    "1 of 3 runs diverged (...)" for those among them that diverged), or "" when every ok run
    learned or was too short to tell (or the runs table has no `learned` column)."""
    if "learned" not in rows.columns:
        return ""
    ok = rows[rows["status"] == "ok"]
    flags = ok["learned"].map(lambda v: v is not None and v == 0)  # NaN: not recorded
    if not flags.any():
        return ""
    diverged = flags & False
    if "diverged" in ok.columns:  # those that diverged are said so: the likelier reason
        diverged = flags & ok["diverged"].map(lambda v: v is not None and v == 1)
    parts = []
    if diverged.any():
        parts.append(
            f"{int(diverged.sum())} of {len(ok)} runs diverged (a non-finite loss, or one far "
            "above its first or running median)"
        )
    if (flags & ~diverged).any():
        parts.append(
            f"{int((flags & ~diverged).sum())} of {len(ok)} runs: the training loss did not "
            "fall by more than its batch-to-batch noise"
        )
    return "; ".join(parts)


def confounded(factor: str) -> str:
    """Why a factor of streams that moved together is not one stream's verdict, and the design
    that separates them; "" for a single stream."""
    if "=" not in factor:
        return ""
    names = factor.split("=")
    fix = "seeds=fl.design.crossed() or `fp4lab run --design streams` (the quant stream"
    fix += " crossed with the others)"
    if "quant" not in names:
        fix = f"seeds=fl.design.crossed(apart={tuple(STREAMS)}) (every stream crossed)"
    return (
        f"{factor}: confounded, the {', '.join(names)} seeds moved together in every run, so "
        f"which of them acts cannot be said; to separate them: {fix}"
    )


def missing_combinations(rows: pd.DataFrame, lay: crossed.Layout, streams) -> str:
    """Which seed combinations of an unbalanced layout did not run, or ran more than once, as
    init/data/quant triples: the runs a balanced design (one run per combination of the
    factors' levels) would add or drop. `rows` are the runs `lay` was made of, in its order."""
    seeds = rows[[f"seed_{s}" for s in streams]].to_numpy()
    level_seeds = []  # per factor: {its level: the seeds of its streams at that level}
    for name, codes in zip(lay.factors, lay.codes, strict=True):
        columns = [streams.index(s) for s in name.split("=")]
        level_seeds.append({int(c): {j: seeds[r, j] for j in columns} for r, c in enumerate(codes)})
    fixed = {j: seeds[0, j] for j in range(len(streams))}  # streams that do not vary

    def triple(levels) -> str:
        values = dict(fixed)
        for f, level in enumerate(levels):
            values |= level_seeds[f][level]
        return "/".join(str(int(values[j])) for j in range(len(streams)))

    ran = list(zip(*(map(int, c) for c in lay.codes), strict=True))
    want = itertools.product(*(range(n) for n in lay.levels))
    lack = [triple(c) for c in want if c not in set(ran)]
    twice = sorted({triple(c) for c in ran if ran.count(c) > 1})
    shown, parts = "/".join(streams), []
    if lack:
        more = ", ..." if len(lack) > 6 else ""
        parts.append(
            f"missing {shown} {', '.join(lack[:6])}{more} ({len(lack)} of "
            f"{int(np.prod(lay.levels))} combinations)"
        )
    if twice:
        parts.append(f"ran more than once: {shown} {', '.join(twice[:6])}")
    return "; ".join(parts) or "not every seed combination ran"
