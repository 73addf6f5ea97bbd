"""The verdict on a sweep: precision choices as fixed effects against the seed streams' spread.

The toolkit's question is whether FP4 training's extra loss comes from randomness or from
structured quantization error. In numbers: is the systematic effect of a precision choice (one
cell against another, paired on the seeds the two cells share) large against the standard
deviation each seed stream induces? `verdict` answers it in one table.

    fixed rows    each pair of cells (or each cell against `baseline`): the mean difference of
                  the outcome, seeds as crossed random effects (`crossed.mean_interval`); the
                  row's factor names the design choice the two cells differ in: recipe,
                  layer rules, GEMM overrides, backward, phases (or several, joined by " + ")
    random rows   per cell, each stream: its *own* SD (its main effect and its interactions
                  short of the full one, which all streams share), judged by an exact F-test;
                  beside it the re-draw SD (own + shared: how far the outcome moves when only
                  this stream's seed is re-drawn), as a description, not a test

Multiple comparisons: every row that gets an interval is one comparison of a family; the
intervals are Bonferroni intervals at level 1 - (1 - level)/m, so that all of them hold
together with probability `level`. Bonferroni rather than Holm because Holm adjusts p-values
and gives no intervals; the verdict word is read off the interval itself (a fixed row) or the
F-test at the same level (a stream row).

What the design can separate (see `crossed`): with one run per seed triple the three-way
interaction is the residual; runs are deterministic functions of their seeds, so it is a real
interaction of the three streams, not measurement noise, but no stream owns it. A stream
"matters" only through what it owns: a stream that acts on the outcome only through that
shared term, or not at all, reads "no evidence". Streams whose seeds always move together are
one factor, and which of them acts cannot be said.

Monte Carlo error: interval ends from generalized draws carry a Monte Carlo standard error
(`lo_mcse`, `hi_mcse`; `redraw_mcse`, `share_mcse` the larger of their two ends'). A fixed
row's word needs the deciding end more than `crossed.MC_SES` standard errors from 0; a row whose
end is nearer is drawn again with `MORE_DRAWS` times the draws (a stream row: its whole cell), and
is "undecided" only if it stays that near. The default `draws` leaves every end of the committed
studies converged to well under a percent of its interval's width.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

from fp4lab.analysis import components, crossed, explain, tables
from fp4lab.analysis.columns import require
from fp4lab.analysis.montecarlo import more_draws
from fp4lab.schema import STREAMS

__all__ = [
    "verdict",
    "baseline_cell",
    "design_factor",
    "in_words",
    "words",
    "stream_words",
    "Words",
]

NAN = float("nan")
# Precision choices a pair of cells can differ in: the runs table's column, the factor's name.
DESIGN = {
    "recipe": "recipe",
    "rules": "layer rules",
    "gemms": "GEMM overrides",
    "backward": "backward",
    "phases": "phases",
}
COLUMNS = ["factor", "kind", "term", "verdict", "effect", "lo", "hi", "lo_mcse", "hi_mcse", "p"]
COLUMNS += ["redraw_sd", "redraw_lo", "redraw_hi", "redraw_mcse", "share", "share_lo", "share_hi"]
COLUMNS += ["share_mcse", "levels", "in_seed_sd", "evidence"]
DRAWS = 1_000_000  # generalized draws per cell: ~500 beyond each end at 1 - 0.05/50
STUCK = "did not learn"  # the word of a row of a cell whose runs did not learn: never judged
MORE_DRAWS = 4  # a row within its Monte Carlo error of deciding is drawn again with 4x the draws


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
    draws: int = DRAWS,
    seed: int = 0,
) -> pd.DataFrame:
    """One table: which precision choices and which seed streams the outcome depends on.

    Fixed rows (factor = `by`, term "B - A"): the mean of the paired differences (see
    `crossed.paired_layout`), its interval from the crossed layout of the shared seeds (generalized
    interval; the t-interval for one stream), verdict "higher" / "lower" when the interval
    excludes 0 by more than `crossed.MC_SES` Monte Carlo standard errors of the deciding end, "no
    evidence" when it contains 0 by as much, else "undecided". `in_seed_sd` = |effect| / the
    SD of one run's outcome over all its seeds (root mean of the two cells' total seed
    variances): the answer to the question, in numbers.
    Random rows (factor = the stream, term = the cell): effect = sqrt(O_f), the stream's own
    SD, O_f = its main effect and its interactions short of the full one (`crossed.own_subsets`;
    with a single varying factor, all of its variance); lo, hi its generalized interval;
    p the exact F-test of O_f = 0 (`crossed.own_test`); share = O_f / total seed variance.
    redraw_sd = sqrt(O_f + s2_full) with its interval: how far the outcome moves when only
    this stream's seed is re-drawn (a description; streams share s2_full). Verdict "matters"
    when the F-test rejects at the row level (p < 1 - row level) and the interval's lower end
    is above 0 by `crossed.MC_SES` Monte Carlo standard errors; "no evidence" when neither
    (the test does not reject and the interval reaches 0); "undecided" when they disagree or
    the end is within its Monte Carlo error of 0. A "matters" thus has the exact test's error
    rate at most, and no printed interval contradicts a word. With a single factor there is
    no test: the interval decides. "no effect at all" when the runs are identical across the
    stream's seeds (bf16 under quant seeds).
    Never judged: "not varied" (one level), "too few seeds" (fewer than 3 levels of a stream
    involved: no interval, never a share), "unbalanced" (a stream's interval needs every seed
    combination once; the evidence names the combinations missing or run twice), "no shared
    seeds" (a contrast with nothing to pair on). A factor named "init=data=quant" (or any
    "a=b") is streams whose seeds moved together in every run: confounded, which of them acts
    cannot be said; its evidence says so and names the design that separates them
    (`fp4lab.sweep.design.crossed`). "did not learn": a contrast with a cell some of whose runs
    did not learn (`learned` False: their training loss did not fall by more than its noise,
    `fp4lab.train.summary.learned`), and every stream row of such a cell; none of them is in
    the Bonferroni family.
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
      verdict, effect, lo, hi, lo_mcse, hi_mcse, p, redraw_sd, redraw_lo, redraw_hi,
      redraw_mcse, share, share_lo, share_hi, share_mcse, levels (fewest seed levels
      involved), in_seed_sd, evidence.
      attrs: outcome, level, comparisons (m), row_level, correction.
    """
    require(runs, (by, "status", outcome, *(f"seed_{s}" for s in streams)), "verdict")
    cells = {c: g for c, g in runs.groupby(by, sort=False)}
    stuck = {cell: explain.not_learned(rows) for cell, rows in cells.items()}
    if baseline is not None and baseline not in cells:
        raise ValueError(f"verdict: baseline={baseline!r} is no {by}; have {list(cells)}")
    fixed, layouts, seed_var = [], {}, {}
    kept = {}
    for cell, rows in cells.items():
        y, lay, kept[cell] = components.cell_draws(rows, outcome, streams)
        layouts[cell] = y, lay
        seed_var[cell] = float(np.var(y, ddof=1)) if len(y) > 1 else NAN
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
        row = dict(factor=factor, kind="fixed", term=f"{b} - {a}", d=d, lay=lay, a=a, b=b)
        fixed.append(row | {"shared": _shared(cells[a], cells[b], outcome, streams)})
    for r in fixed:  # a contrast with a cell that did not learn is not judged
        r["stuck"] = "; ".join(
            f"{c} did not learn ({stuck[c]})" for c in (r["b"], r["a"]) if stuck[c]
        )
    # the family: every judged contrast and every factor of a cell whose streams get intervals
    m = sum(
        r["lay"] is not None
        and not r["stuck"]
        and min(r["lay"].levels, default=1) >= crossed.MIN_LEVELS
        for r in fixed
    )
    m += sum(len(lay.factors) for c, (_, lay) in layouts.items() if _judged(lay) and not stuck[c])
    row_level = 1 - (1 - level) / max(m, 1)
    rows = [_fixed_row(r, seed_var, row_level, draws, seed) for r in fixed]
    for i, (cell, (y, lay)) in enumerate(layouts.items()):  # one cell's draws in memory at once
        if stuck[cell]:
            pending = _stream_rows(cell, y, lay, None, streams, kept[cell])
            why = f"{cell} did not learn ({stuck[cell]})"
            rows += [_random_row(r | dict(reason=STUCK, why=why, draws=None), 0) for r in pending]
            continue
        n = draws
        while True:
            gci = crossed.gci_draws(y, lay, draws=n, seed=seed + i) if _judged(lay) else None
            pending = _stream_rows(cell, y, lay, gci, streams, kept[cell])
            judged = [_random_row(r, row_level, last=n >= MORE_DRAWS * draws) for r in pending]
            if not any(r.get("more_draws") for r in judged):
                break
            n *= MORE_DRAWS
        rows += [_explained(r) for r in judged]
    out = pd.DataFrame(rows, columns=COLUMNS)
    out.attrs = dict(outcome=outcome, level=level, comparisons=m, row_level=row_level)
    out.attrs |= dict(correction="Bonferroni", interval="generalized (crossed random seeds)")
    return out


class Words(NamedTuple):
    """The verdict in sentences (`words`)."""

    header: str  # the baseline, the outcome and the family ("" with one cell)
    cells: list[str]  # one per other cell: how it differs from the baseline
    streams: list[str]  # one per cell and stream: its own spread, or why it is not judged
    stuck: list[str]  # one per cell some of whose runs did not learn


def in_words(
    runs: pd.DataFrame, outcome: str = "loss_gap", *, by: str = "cell", **kw
) -> tuple[str, list[str]]:
    """Which cells differ from the baseline, one sentence each: the verdict's fixed rows
    (`words`' header and cells)."""
    said = words(runs, outcome, by=by, **kw)
    return said.header, said.cells


def baseline_cell(runs: pd.DataFrame, by: str = "cell") -> str | None:
    """The cell the summary compares every other cell with (`words`, `fp4lab show`, the report):
    a cell of the first `tables.BASELINE_RECIPES` recipe present (one without GEMM overrides,
    backward mode, rules or phases, if there is one), else the first cell; None for no runs.
    One baseline gives one family of rows, so each contrast has the same interval everywhere."""
    names = list(dict.fromkeys(runs[by]))
    if not names:
        return None
    recipes = set(runs["recipe"].dropna()) if "recipe" in runs.columns else set()
    found = next((r for r in tables.BASELINE_RECIPES if r in recipes), None)
    if found is None:
        return names[0]
    candidates = runs[runs["recipe"] == found]
    plain = np.ones(len(candidates), bool)
    for column in ("gemms", "backward", "rules", "phases"):
        if column in candidates.columns:
            plain &= candidates[column].astype(str).isin(("", "{}", "()", "[]", "None", "nan"))
    return (candidates[plain] if plain.any() else candidates)[by].iloc[0]


def words(runs: pd.DataFrame, outcome: str = "loss_gap", *, by: str = "cell", **kw) -> Words:
    """The verdict in sentences: which cells differ from the baseline, which streams matter in
    each cell, which cells did not learn.

    The baseline is a cell of the first `tables.BASELINE_RECIPES` recipe present (one without
    GEMM overrides, backward mode, rules or phases, if there is one), else the first cell.
    A stream row reads "quant in recipe=nvfp4: no evidence (own SD 0.002 [0, 0.011], re-draw SD
    0.004)"; a row not judged gives its reason and what would judge it (the combinations
    missing, the design that separates confounded streams).

    Args:
      runs: the runs table. outcome, by: as in `verdict`. kw: more arguments of `verdict`.
    Returns:
      Words: header, cells (e.g. "recipe=nvfp4: higher than recipe=bf16 by +0.045 [+0.041,
      +0.048], 6.2 seed SDs"), streams, stuck ("recipe=nvfp4: did not learn: 3 of 3 runs:
      the training loss never fell below its first value").
    """
    require(runs, (by, "status", outcome), "words")
    names = list(dict.fromkeys(runs[by]))
    base = baseline_cell(runs, by)
    stuck = {c: explain.not_learned(g) for c, g in runs.groupby(by, sort=False)}
    stuck_lines = [f"{c}: did not learn: {why}" for c, why in stuck.items() if why]
    if not names:
        return Words("", [], [], [])
    table = verdict(runs, outcome, by=by, baseline=base if len(names) > 1 else None, **kw)
    fixed = table[table["kind"] == "fixed"]
    a = table.attrs
    header = ""
    if len(names) > 1:
        header = (
            f"against {base} ({outcome}; intervals over seeds as random effects, Bonferroni "
            f"over {a['comparisons']} rows, {a['level']:.0%} together):"
        )
    lines = []
    for row in fixed.itertuples():
        cell = row.term.split(" - ")[0]
        ci = f"{row.effect:+.3g} [{row.lo:+.3g}, {row.hi:+.3g}]"
        if row.verdict == STUCK:
            lines.append(f"{cell}: not judged: {row.evidence}")
            continue
        if row.verdict in ("higher", "lower"):
            text = f"{row.verdict} than {base} by {ci}, {row.in_seed_sd:.2g} seed SDs"
        elif row.verdict == "no evidence":
            text = f"no evidence of a difference: {ci}"
        else:
            text = f"{row.verdict}: {row.evidence}"
        lines.append(f"{cell}: {text}")
    return Words(header, lines, stream_words(table), stuck_lines)


def stream_words(table: pd.DataFrame) -> list[str]:
    """One sentence per random row of a verdict table: the stream's word with its own SD and
    re-draw SD, or the reason it is not judged; a confounded factor says so. The rows of a
    cell that did not learn are left out (`Words.stuck` says it, once a cell)."""
    out = []
    for row in table[(table["kind"] == "random") & (table["verdict"] != STUCK)].itertuples():
        head = f"{row.factor} in {row.term}: {row.verdict}"
        if row.verdict in ("matters", "no evidence", "undecided") and np.isfinite(row.lo):
            text = f"{head} (own SD {_ci(row.effect, row.lo, row.hi)}, re-draw SD "
            text += f"{row.redraw_sd:.3g})"
            if why := explain.confounded(row.factor):
                text += f"; {why}"
        else:
            text = f"{head}: {row.evidence}"
        out.append(text)
    return out


def design_factor(a: pd.DataFrame, b: pd.DataFrame) -> str:
    """The precision choices (`DESIGN`) two cells' runs differ in, joined by " + "; "" when
    they differ in none of them (or the runs table has no such columns)."""

    def value(rows: pd.DataFrame, column: str) -> str:
        return repr(rows[column].iloc[0]) if len(rows) else ""

    differ = [name for col, name in DESIGN.items() if col in a and value(a, col) != value(b, col)]
    return " + ".join(differ)


def _shared(a: pd.DataFrame, b: pd.DataFrame, outcome: str, streams) -> list[tuple]:
    """The seed triples both cells ran (with a finite outcome), in order."""
    cols = [f"seed_{s}" for s in streams]
    seeds = [
        set(map(tuple, crossed.finite_runs(rows, outcome)[cols].astype(int).to_numpy().tolist()))
        for rows in (a, b)
    ]
    return sorted(seeds[0] & seeds[1])


def _judged(lay: crossed.Layout) -> bool:
    """Whether a balanced layout has the levels an interval needs in every factor."""
    return lay.balanced and min(lay.levels, default=1) >= crossed.MIN_LEVELS


def _explained(row: dict) -> dict:
    if why := explain.confounded(row["factor"]):
        row["evidence"] = f"{row['evidence']}; {why}" if row["evidence"] else why
    return row


def _stream_rows(cell, y, lay, gci, streams, kept=None) -> list[dict]:
    """One pending row per stream of a cell (the layout and draws it is judged on, or why not)."""
    rows, named = [], {}
    for i, name in enumerate(lay.factors):
        for stream in name.split("="):
            named[stream] = (i, name)
    done = set()
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
            why = "not every seed combination ran"
            if kept is not None:
                why = explain.missing_combinations(kept, lay, list(streams))
            rows.append(base | dict(reason="unbalanced", why=why))
        else:
            rows.append(base | dict(draws=gci, y=y, lay=lay, index=i))
    return rows


def _random_row(r: dict, row_level: float, last: bool = True) -> dict:
    """A stream row's numbers and word; `last`: its draws are the most it gets (else a row
    within its Monte Carlo error of deciding asks for more, `more_draws`)."""
    out = {k: r.get(k, NAN) for k in ("factor", "kind", "term", "levels")}
    out |= {c: NAN for c in COLUMNS if c not in out and c not in ("verdict", "evidence")}
    if r["draws"] is None:
        return out | dict(verdict=r["reason"], evidence=r["why"])
    lay, gci = r["lay"], r["draws"]
    ms = crossed.mean_squares(r["y"], lay)
    raw = crossed.ems_components({s: m for s, (m, _) in ms.items()}, lay)
    point = crossed.stream_draws(raw, lay, r["index"])
    own, redraw, share = (float(point[k]) for k in ("own", "redraw", "share"))
    drawn = crossed.stream_draws(gci["raw"], lay, r["index"])
    sd, rd, sh = (
        crossed.quantile_ends(x, row_level)
        for x in (np.sqrt(drawn["own"]), np.sqrt(drawn["redraw"]), drawn["share"])
    )
    out |= dict(effect=np.sqrt(own), lo=sd.lo, hi=sd.hi, lo_mcse=sd.lo_se, hi_mcse=sd.hi_se)
    out |= dict(redraw_sd=np.sqrt(redraw), redraw_lo=rd.lo, redraw_hi=rd.hi)
    out |= dict(redraw_mcse=max(rd.lo_se, rd.hi_se), share=share)
    out |= dict(share_lo=sh.lo, share_hi=sh.hi, share_mcse=max(sh.lo_se, sh.hi_se))
    if redraw == 0 and not np.any(drawn["redraw"] > 0):
        out |= dict(p=1.0)
        return out | dict(
            verdict="no evidence", evidence="no effect at all: runs identical across its seeds"
        )
    test = crossed.own_test(ms, lay, r["index"])
    text = f"own SD {_ci(out['effect'], sd.lo, sd.hi)}"
    interval_yes = sd.lo > crossed.MC_SES * sd.lo_se
    interval_no = sd.lo <= 0
    if test is None:  # a single factor: no shared term, its variance is all its own
        test_yes = None
    else:
        out["p"] = test.p
        text += f", F({test.df1}, {test.df2}) = {test.f:.3g}, p = {test.p:.2g}"
        test_yes = test.p < 1 - row_level
    text += f"; re-draw SD {_ci(out['redraw_sd'], rd.lo, rd.hi)}"
    text += f"; own share {_ci(out['share'], sh.lo, sh.hi)}"
    if interval_yes and test_yes is not False:
        return out | dict(verdict="matters", evidence=text)
    if interval_no and not test_yes:
        missed = f"; an own SD up to {sd.hi:.3g} could be missed"
        return out | dict(verdict="no evidence", evidence=text + missed)
    if interval_yes or interval_no:
        why = "the exact test and the interval disagree: more seeds decide it"
    else:
        if not last:
            return out | dict(verdict="undecided", more_draws=True)
        why = (
            f"the interval's lower end is within {crossed.MC_SES} Monte Carlo standard errors of"
            f" 0 at {len(r['draws']['mean']):,} draws"
        )
    return out | dict(verdict="undecided", evidence=f"{text}; {why}")


def _fixed_row(r: dict, seed_var: dict, row_level: float, draws: int, seed: int) -> dict:
    out = {c: NAN for c in COLUMNS} | dict(factor=r["factor"], kind="fixed", term=r["term"])
    out |= dict(levels=0)
    if r.get("stuck"):
        return out | dict(verdict=STUCK, evidence=r["stuck"])
    if r["lay"] is None and r.get("shared"):  # the same seed(s), no stream varied in both
        n = len(r["shared"])
        seeds = ", ".join("/".join(map(str, t)) for t in r["shared"][:3])
        said = f"{'one shared seed' if n == 1 else f'{n} shared seeds'} (init/data/quant {seeds})"
        return out | dict(
            verdict="too few seeds",
            evidence=f"{said}, no stream varied in both cells: no interval; "
            f"need {crossed.MIN_LEVELS} levels of a stream in each",
        )
    if r["lay"] is None:
        return out | dict(verdict="no shared seeds", evidence="nothing to pair on")
    d, lay = r["d"], r["lay"]
    fewest = min(lay.levels, default=1)
    out["levels"] = fewest
    interval = more_draws(
        lambda n: crossed.mean_interval(d, lay, level=row_level, draws=n, seed=seed),
        draws,
        MORE_DRAWS * draws,
    )
    sd = np.sqrt((seed_var[r["a"]] + seed_var[r["b"]]) / 2)
    out |= dict(effect=interval.estimate, in_seed_sd=abs(interval.estimate) / sd if sd > 0 else NAN)
    if fewest < crossed.MIN_LEVELS:
        return out | dict(verdict="too few seeds", evidence=interval.method)
    out |= dict(lo=interval.lo, hi=interval.hi, lo_mcse=interval.lo_se, hi_mcse=interval.hi_se)
    text = f"{_ci(interval.estimate, interval.lo, interval.hi)} ({interval.method}, "
    text += f"{len(d)} pairs over {'x'.join(map(str, lay.levels))} seeds)"
    word = crossed.side_word(interval.lo, interval.hi, interval.lo_se, interval.hi_se)
    if word in ("higher", "lower"):
        return out | dict(verdict=word, evidence=f"{text}; {out['in_seed_sd']:.2g} seed SDs")
    if word == "undecided":
        near = (
            f"an end within {crossed.MC_SES} Monte Carlo standard errors of 0 at"
            f" {MORE_DRAWS * draws:,} draws"
        )
        return out | dict(verdict=word, evidence=f"{text}; {near}")
    missed = max(abs(interval.lo), abs(interval.hi))
    return out | dict(verdict="no evidence", evidence=f"{text}; up to {missed:.3g} could be missed")
