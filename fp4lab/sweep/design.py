"""Seed designs: which seed triples a cell runs, chosen for the question it answers.

`seeds=n` runs the triples (i, i, i): the three streams move together, so the verdict can say
how much the seeds matter but not which stream (its row is `init=data=quant`, one factor). To
ask whether FP4's extra loss is randomness (the quant stream) or structured error, the quant
stream must be crossed with the others:

    add(recipe="nvfp4", seeds=fl.design.crossed())     # in an experiment file
    fp4lab run experiments/mine.py --design streams      # the same for every cell
    fp4lab run experiments/mine.py --design streams --seeds 4   # 4 levels a stream

`crossed(n)` runs every combination of n init=data seeds and n quant seeds: n**2 runs a cell
(9 at the default n = 3, the fewest levels a stream's interval needs,
`fp4lab.analysis.crossed.MIN_LEVELS`). The verdict then gives the quant stream a row of its own
and judges it ("matters" / "no evidence"), with init and data as one factor `init=data`;
`crossed(n, apart=STREAMS)` crosses all three (n**3 runs) and separates init from data too.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from fp4lab.schema import STREAMS

__all__ = ["DESIGNS", "MIN_LEVELS", "crossed", "named"]

MIN_LEVELS = 3  # levels a stream's interval needs (`fp4lab.analysis.crossed.MIN_LEVELS`)
DESIGNS = {"streams": "the quant stream crossed with init=data, 3 levels each: 9 runs a cell"}


def crossed(n: int = MIN_LEVELS, *, apart: Sequence[str] = ("quant",)) -> list[tuple[int, ...]]:
    """Seed triples (init, data, quant) that cross the streams in `apart` with the others.

    Every stream in `apart` gets its own seeds 0..n-1; the other streams share one seed, also
    0..n-1 (they move together); the triples are every combination: n ** (len(apart) + 1)
    when some stream is left to move with the rest, else n ** 3.

    Args:
      n: levels of each factor (>= 3 for the verdict to judge a stream).
      apart: the streams crossed with the rest (default the quant stream: randomness of the
        quantizer against the model's and the data's).
    Returns:
      a list of (init, data, quant) triples, as `seeds=` takes them.
    Raises:
      ValueError: n below MIN_LEVELS, or an unknown stream in `apart`.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < MIN_LEVELS:
        raise ValueError(
            f"crossed: n={n!r}; need an int >= {MIN_LEVELS} (fewer levels of a stream give "
            "its verdict row no interval)"
        )
    apart = (apart,) if isinstance(apart, str) else tuple(apart)
    bad = [s for s in apart if s not in STREAMS]
    if bad or not apart:
        raise ValueError(f"crossed: apart={apart!r}; allowed: one or more of {STREAMS}")
    together = [s for s in STREAMS if s not in apart]
    factors = [s for s in STREAMS if s in apart] + ([together[0]] if together else [])
    triples = []
    for levels in itertools.product(range(n), repeat=len(factors)):
        level = dict(zip(factors, levels, strict=True))
        shared = level[together[0]] if together else None
        triples.append(tuple(level.get(s, shared) for s in STREAMS))
    return sorted(triples)


def named(name: str, n: int | None = None) -> list[tuple[int, ...]]:
    """The seeds of a named design (`DESIGNS`), n levels a stream (default its own)."""
    if name not in DESIGNS:
        raise ValueError(f"design {name!r}; allowed: {', '.join(DESIGNS)}")
    return crossed(MIN_LEVELS if n is None else n)
