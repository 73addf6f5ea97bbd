"""The verdict on a sweep: precision choices as fixed effects against the seed streams' spread.

The toolkit's question is whether FP4 training's extra loss comes from randomness or from
structured quantization error. In numbers: is the systematic effect of a precision choice (one
cell against another, paired on the seeds the two cells share) large against the standard
deviation each seed stream induces? `verdict` answers it in one table.

    fixed rows    each pair of cells (or each cell against `baseline`): the mean difference of
                  the outcome, seeds as crossed random effects (`crossed.mean_interval`); the
                  row's factor names the design choice the two cells differ in: recipe,
                  layer rules, GEMM overrides, backward, phases (or several, joined by " + ")
    random rows   per cell, each stream: the SD it induces with the other streams held fixed,
                  its interactions included (`components.stream_totals`), and its share

Multiple comparisons: every row that gets an interval is one comparison of a family; the
intervals are Bonferroni intervals at level 1 - (1 - level)/m, so that all of them hold
together with probability `level`. Bonferroni rather than Holm because Holm adjusts p-values
and gives no intervals; the verdict word is read off the interval itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fp4lab.analysis import components, crossed
from fp4lab.schema import STREAMS

__all__ = ["verdict", "design_factor"]

NAN = float("nan")
# Precision choices a pair of cells can differ in: the runs table's column, the factor's name.
DESIGN = {
    "recipe": "recipe",
    "rules": "layer rules",
    "gemms": "GEMM overrides",
    "backward": "backward",
    "phases": "phases",
}
COLUMNS = ["factor", "kind", "term", "verdict", "effect", "lo", "hi", "share", "share_lo"]
COLUMNS += ["share_hi", "levels", "in_seed_sd", "evidence"]


def _ci(x: float, lo: float, hi: float) -> str:
    return f"{x:.3g} [{lo:.3g}, {hi:.3g}]"


def verdict(
    runs: pd.DataFrame,
    outcome: str = "loss_gap",
    *,
    by: str = "cell",
    streams: Sequence[str] = STREAMS,
    baseline: str | None = None,
    level: float = 0.95,
    draws: int = 4000,
    seed: int = 0,
) -> pd.DataFrame:
    """One table: which precision choices and which seed streams the outcome depends on.

    Fixed rows (factor = `by`, term "B - A"): the mean of the paired differences (see
    `crossed.paired_layout`), its interval from the crossed layout of the shared seeds (generalized
    interval; the t-interval for one stream), verdict "higher" / "lower" when the interval
    excludes 0, else "no evidence". `in_seed_sd` = |effect| / the SD of one run's outcome
    over all its seeds (root mean of the two cells' total seed variances): the answer to the
    question, in numbers.
    Random rows (factor = the stream, term = the cell): effect = sqrt(V_f), the SD a stream
    induces with the other streams fixed, V_f = its component plus every interaction it is in
    (a run is a deterministic function of its seeds, so the residual is the full interaction
    and enters each stream's V_f); share = V_f / total seed variance (shares of different
    streams overlap by their shared interactions). Verdict "matters" when the lower end of
    the SD interval is above 0, else "no evidence" (with the interval [0, 0] and "no effect
    at all" when the runs are identical across the stream's seeds: bf16 under quant seeds).
    Including the residual in V_f relies on runs being deterministic functions of their seeds
    (they are: tests/train checks it bit for bit); otherwise run-to-run noise would count
    for every stream.
    Never judged: "not varied" (one level), "too few seeds" (fewer than 3 levels of a stream
    involved: no interval, never a share), "unbalanced" (a stream's interval needs every seed
    combination once), "no shared seeds" (a contrast with nothing to pair on).
    For "no evidence" the evidence says how large an effect the seeds could have missed: the
    largest |end| of the interval.

    Args:
      runs: the runs table (status "ok" runs with a finite outcome enter).
      outcome: the column judged. by: the column whose values are the fixed-effect cells.
      streams: the seed streams. baseline: a value of `by`; contrasts are then each cell
        against it, else every pair of cells (the later one minus the earlier one).
      level: family-wise coverage (Bonferroni over all judged rows).
      draws: generalized pivotal draws per cell. seed: their seed (same call, same table).
    Returns:
      DataFrame with columns factor (fixed rows: the design choice, see `design_factor`; `by`
      when the cells differ in none; random rows: the stream), kind ("fixed"/"random"), term,
      verdict, effect, lo, hi,
      share, share_lo, share_hi, levels (fewest seed levels involved), in_seed_sd, evidence.
      attrs: outcome, level, comparisons (m), row_level, correction.
    """
    cells = {c: g for c, g in runs.groupby(by, sort=False)}
    if baseline is not None and baseline not in cells:
        raise ValueError(f"verdict: baseline={baseline!r} is no {by}; have {list(cells)}")
    fixed, random, seed_var = [], [], {}
    for i, (cell, rows) in enumerate(cells.items()):
        y, lay, _ = components.cell_draws(rows, outcome, streams)
        draws_ = None
        if lay.balanced and min(lay.levels, default=1) >= crossed.MIN_LEVELS:
            draws_ = crossed.gci_draws(y, lay, draws=draws, seed=seed + i)
        seed_var[cell] = float(np.var(y, ddof=1)) if len(y) > 1 else NAN
        random += _stream_rows(cell, y, lay, draws_, streams)
        if lay.balanced:
            point = crossed.mean_squares(y, lay)
            raw = crossed.ems_components({s: m for s, (m, _) in point.items()}, lay)
            seed_var[cell] = float(sum(max(v, 0.0) for v in raw.values()))
    names = list(cells)
    pairs = [(baseline, c) for c in names if c != baseline] if baseline else []
    if baseline is None:
        pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    for a, b in pairs:
        d, lay = crossed.paired_layout(cells[a], cells[b], outcome, streams)
        factor = design_factor(cells[a], cells[b]) or by
        fixed.append(dict(factor=factor, kind="fixed", term=f"{b} - {a}", d=d, lay=lay, a=a, b=b))
    m = sum(
        r["lay"] is not None and min(r["lay"].levels, default=1) >= crossed.MIN_LEVELS
        for r in fixed
    )
    m += sum(r["draws"] is not None for r in random)
    row_level = 1 - (1 - level) / max(m, 1)
    rows = [_fixed_row(r, seed_var, row_level, draws, seed) for r in fixed]
    rows += [_random_row(r, row_level) for r in random]
    out = pd.DataFrame(rows, columns=COLUMNS)
    out.attrs = dict(outcome=outcome, level=level, comparisons=m, row_level=row_level)
    out.attrs |= dict(correction="Bonferroni", interval="generalized (crossed random seeds)")
    return out


def design_factor(a: pd.DataFrame, b: pd.DataFrame) -> str:
    """The precision choices (`DESIGN`) two cells' runs differ in, joined by " + "; "" when
    they differ in none of them (or the runs table has no such columns)."""

    def value(rows: pd.DataFrame, column: str) -> str:
        return repr(rows[column].iloc[0]) if len(rows) else ""

    differ = [name for col, name in DESIGN.items() if col in a and value(a, col) != value(b, col)]
    return " + ".join(differ)


def _stream_rows(cell, y, lay, gci, streams) -> list[dict]:
    """One pending row per stream of a cell (draws of V_f and of its share, or a reason)."""
    rows, named = [], {}
    for i, name in enumerate(lay.factors):
        for stream in name.split("="):
            named[stream] = (i, name)
    done = set()
    totals = share = None
    if gci is not None:
        totals = components.stream_totals(gci["variance"], lay)
        total = sum(gci["variance"].values())
        with np.errstate(invalid="ignore", divide="ignore"):
            share = {k: v / total for k, v in totals.items()}
    for stream in streams:
        base = dict(factor=stream, kind="random", term=cell, draws=None)
        if stream not in named:
            rows.append(base | dict(levels=1, reason="not varied", why="one seed level"))
            continue
        i, name = named[stream]
        if name in done:
            continue
        done.add(name)
        base |= dict(factor=name, levels=lay.levels[i])
        if lay.levels[i] < crossed.MIN_LEVELS or (gci is None and lay.balanced):
            fewest = min(lay.levels, default=1)
            why = f"{fewest} level(s) of some stream in this cell; need {crossed.MIN_LEVELS}"
            rows.append(base | dict(reason="too few seeds", why=why))
        elif gci is None:
            rows.append(base | dict(reason="unbalanced", why="not every seed combination ran"))
        else:
            zero = bool(np.all(totals[name] == 0))
            rows.append(base | dict(draws=(totals[name], share[name]), zero=zero))
            rows[-1]["y"], rows[-1]["lay"], rows[-1]["index"] = y, lay, i
    return rows


def _random_row(r: dict, row_level: float) -> dict:
    out = {k: r.get(k, NAN) for k in ("factor", "kind", "term", "levels")}
    out |= dict(effect=NAN, lo=NAN, hi=NAN, share=NAN, share_lo=NAN, share_hi=NAN)
    out |= dict(in_seed_sd=NAN)
    if r["draws"] is None:
        return out | dict(verdict=r["reason"], evidence=r["why"])
    total_draws, share_draws = r["draws"]
    lay, y = r["lay"], r["y"]
    ms = crossed.mean_squares(y, lay)
    raw = crossed.ems_components({s: m for s, (m, _) in ms.items()}, lay)
    variance = {s: max(v, 0.0) for s, v in raw.items()}
    v_f = sum(v for s, v in variance.items() if r["index"] in s)
    total = sum(variance.values())
    lo, hi = crossed.quantiles(total_draws, row_level)
    share_lo, share_hi = crossed.quantiles(share_draws, row_level)
    out |= dict(effect=np.sqrt(v_f), lo=np.sqrt(lo), hi=np.sqrt(hi))
    out |= dict(share=v_f / total if total > 0 else NAN, share_lo=share_lo, share_hi=share_hi)
    if r["zero"]:
        return out | dict(
            verdict="no evidence", evidence="no effect at all: runs identical across its seeds"
        )
    text = f"SD {_ci(out['effect'], out['lo'], out['hi'])}, "
    text += f"share {_ci(out['share'], share_lo, share_hi)}"
    if out["lo"] > 0:
        return out | dict(verdict="matters", evidence=text)
    missed = f"; an SD up to {out['hi']:.3g} could be missed"
    return out | dict(verdict="no evidence", evidence=text + missed)


def _fixed_row(r: dict, seed_var: dict, row_level: float, draws: int, seed: int) -> dict:
    out = dict(factor=r["factor"], kind="fixed", term=r["term"], share=NAN, share_lo=NAN)
    out |= dict(share_hi=NAN, effect=NAN, lo=NAN, hi=NAN, in_seed_sd=NAN, levels=0)
    if r["lay"] is None:
        return out | dict(verdict="no shared seeds", evidence="nothing to pair on")
    d, lay = r["d"], r["lay"]
    fewest = min(lay.levels, default=1)
    out["levels"] = fewest
    interval = crossed.mean_interval(d, lay, level=row_level, draws=draws, seed=seed)
    sd = np.sqrt((seed_var[r["a"]] + seed_var[r["b"]]) / 2)
    out |= dict(effect=interval.estimate, in_seed_sd=abs(interval.estimate) / sd if sd > 0 else NAN)
    if fewest < crossed.MIN_LEVELS:
        return out | dict(verdict="too few seeds", evidence=interval.method)
    out |= dict(lo=interval.lo, hi=interval.hi)
    text = f"{_ci(interval.estimate, interval.lo, interval.hi)} ({interval.method}, "
    text += f"{len(d)} pairs over {'x'.join(map(str, lay.levels))} seeds)"
    if interval.lo > 0 or interval.hi < 0:
        word = "higher" if interval.lo > 0 else "lower"
        return out | dict(verdict=word, evidence=f"{text}; {out['in_seed_sd']:.2g} seed SDs")
    missed = max(abs(interval.lo), abs(interval.hi))
    return out | dict(verdict="no evidence", evidence=f"{text}; up to {missed:.3g} could be missed")
