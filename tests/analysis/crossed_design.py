"""Synthetic crossed seed designs with known variance components, shared by the analysis tests."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from fp4lab.analysis import crossed

COMPONENTS = ("init", "data", "quant", "init:data", "init:quant", "data:quant", "residual")


def crossed_outcomes(levels=(4, 4, 4), sd=(1, 0.7, 0.5, 0.5, 0.8, 0.3, 0.4), rng=0, offset=0.0,
                     interaction=None) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:  # fmt: skip
    """The outcomes of `crossed_cell` in its row order and the seed codes (init, data, quant)
    of each row, without the table (the coverage simulations make thousands)."""
    gen = np.random.default_rng(rng)
    a, b, c = levels
    i, j, k = (x.ravel() for x in np.meshgrid(range(a), range(b), range(c), indexing="ij"))
    terms = [
        gen.normal(size=a)[i],
        gen.normal(size=b)[j],
        gen.normal(size=c)[k],
        gen.normal(size=(a, b))[i, j],
        gen.normal(size=(a, c))[i, k],
        gen.normal(size=(b, c))[j, k],
        gen.normal(size=a * b * c),
    ]
    y = offset + sum(s * t for s, t in zip(sd, terms, strict=True))
    if interaction is not None:
        y = y + interaction * gen.normal(size=(a, c))[i, k]
    return y, (i, j, k)


def crossed_cell(name="c", levels=(4, 4, 4), sd=(1, 0.7, 0.5, 0.5, 0.8, 0.3, 0.4), rng=0,
                 offset=0.0, interaction=None) -> pd.DataFrame:  # fmt: skip
    """One cell of a crossed design: loss_gap = offset + the sum of independent normal terms,
    one per component of `COMPONENTS` with the SDs `sd`; `interaction` adds a second planted
    init x quant table with that SD."""
    y, (i, j, k) = crossed_outcomes(levels, sd, rng, offset, interaction)
    return pd.DataFrame(
        dict(run_id=[f"{name}{n}" for n in range(len(y))], cell=name, status="ok", loss_gap=y)
        | dict(seed_init=i, seed_data=j, seed_quant=k)
    )


def pigeonhole_misses(y, lay, levels, seed: int, check: bool) -> dict[float, bool]:
    """{level: missed 0} of one table's pigeonhole `crossed.mean_interval`, computed once at
    levels[0] and taken to the others with `pigeonhole_at`; where `check`, each is asserted
    equal to `mean_interval`'s own at that level."""
    interval = crossed.mean_interval(y, lay, level=levels[0], draws=2000, seed=seed)
    assert interval.method == "pigeonhole"
    out = {}
    for level in levels:
        lo, hi = pigeonhole_at(interval, levels[0], level, min(lay.levels))
        if check:
            printed = crossed.mean_interval(y, lay, level=level, draws=2000, seed=seed)
            assert (lo, hi) == pytest.approx((printed.lo, printed.hi), rel=1e-12, abs=1e-15)
        out[level] = not lo <= 0.0 <= hi
    return out


def pigeonhole_at(interval, level, to, fewest):
    """A pigeonhole `crossed.mean_interval` at level `to` from the one at `level`: the same
    bootstrap SD times the t quantile of `to` on fewest - 1 df (mean_interval's formula)."""
    t = scipy_stats.t(fewest - 1)
    half = (interval.hi - interval.estimate) * t.ppf(0.5 + to / 2) / t.ppf(0.5 + level / 2)
    return interval.estimate - half, interval.estimate + half
