"""Synthetic crossed seed designs with known variance components, shared by the analysis tests."""

import numpy as np
import pandas as pd

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
