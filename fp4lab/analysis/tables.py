"""Per-cell tables of a sweep: divergence, loss gaps, paired differences, tokens to target.

Reads only the results store's two tables (`fp4lab.analysis.frames`), never the training code.
Every estimate comes with an interval:

    proportions (divergence rate)          Clopper-Pearson (exact) interval
    a mean over seeds (loss gap)           seeds as crossed random effects (`crossed`): t for
                                           seed triples (i, i, i), generalized when crossed
    a difference between two cells         the same, over the seeds the two cells share
    a median over seeds (tokens)           order statistics (distribution-free)
    an overhead against a baseline         ratio of geometric means, Welch t on the logs;
                                           runs assumed independent (seed triples)

Only runs with status "ok" give outcomes; every table counts the others. A run that never
reaches the target counts as needing infinitely many tokens: it is never silently dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from fp4lab.analysis import crossed
from fp4lab.analysis.columns import require
from fp4lab.analysis.factors import design_factors
from fp4lab.analysis.frames import ok_runs
from fp4lab.analysis.intervals import (
    MCInterval,
    Stat,
    bootstrap_ci,
    exact_binomial_interval,
    log_ratio_interval,
    median_interval,
    ratio_ci,
)
from fp4lab.analysis.montecarlo import more_draws, side_word
from fp4lab.schema import STREAMS

__all__ = [
    "BASELINE_RECIPES",
    "divergence_rate",
    "loss_gap",
    "paired_difference",
    "retarget",
    "tokens_to_target",
    "default_baseline",
    "fixed_rows",
    "with_family",
]

BASELINE_RECIPES = ("bf16", "fp32", "fp8")  # default overhead baseline: the first one swept
FIXED = ["term", "effect", "lo", "hi", "lo_mcse", "hi_mcse", "verdict"]  # `fixed_rows`
MAX_DRAWS_FACTOR = 16  # paired_difference: an undecided word is redrawn up to this many times
NAN = float("nan")


def _groups(runs: pd.DataFrame, by: Sequence[str]) -> Iterable[tuple[dict, pd.DataFrame]]:
    """(key dict, rows) per group of `by`, in order of first appearance; NaN keys kept."""
    for key, rows in runs.groupby(list(by), sort=False, dropna=False):
        yield dict(zip(by, key, strict=True)), rows


def divergence_rate(runs: pd.DataFrame, by: Sequence[str] = ("cell",), *, level=0.95):
    """Fraction of runs that diverged per group, with an exact (Clopper-Pearson) interval.

    rate = diverged / n over the runs with status "ok" (a failed run is neither a divergence nor
    a success: it is counted in `failed` and left out of n).

    Returns:
      DataFrame with the `by` columns and n, failed, diverged, nonfinite, spike (by kind), rate,
      rate_lo, rate_hi, and the median divergence step among the runs that diverged.
    """
    need = ("status", "diverged", "divergence_kind", "divergence_step")
    require(runs, (*by, *need), "divergence_rate")
    rows = []
    for key, g in _groups(runs, by):
        ok = ok_runs(g)
        div = ok["diverged"].astype(bool)
        kind = ok["divergence_kind"].astype(str)
        rate = exact_binomial_interval(int(div.sum()), len(ok), level)
        rows.append(
            key
            | dict(n=len(ok), failed=len(g) - len(ok), diverged=int(div.sum()))
            | dict(nonfinite=int((kind == "nonfinite").sum()), spike=int((kind == "spike").sum()))
            | dict(rate=rate.estimate, rate_lo=rate.lo, rate_hi=rate.hi)
            | dict(median_divergence_step=ok.loc[div, "divergence_step"].median())
        )
    return pd.DataFrame(rows)


def loss_gap(
    runs: pd.DataFrame,
    by: Sequence[str] = ("cell",),
    *,
    outcome: str = "loss_gap",
    streams: Sequence[str] = STREAMS,
    level: float = 0.95,
    draws: int = crossed.DRAWS,
    seed: int = 0,
) -> pd.DataFrame:
    """Gap of the final loss to the task's optimum per group, with an interval over seeds.

        gap = mean over the group's runs of (final_loss - loss_floor)

    The floor is exact for the synthetic tasks (e.g. a Markov source's entropy rate), so a gap
    of 0 means the task is solved. Runs with a non-finite outcome (a diverged run's NaN loss)
    cannot enter a mean: they are counted in `nonfinite`, and the interval is over the rest.
    Interval: the seeds are random effects (`crossed.mean_interval`): a t-interval when the
    streams move together (seed triples (i, i, i)), a generalized interval over the levels of
    each stream when they are crossed, a pigeonhole bootstrap when some runs are missing.
    Fewer than 3 levels of a stream: no interval, `method` says so.

    Args:
      by: grouping columns. outcome: the column summarised ("loss_gap"; "final_loss" when no
        floor is known; "loss_gap_hp" for the high-precision measurement).
      streams: the seed streams. level: coverage. draws, seed: Monte Carlo size and seed.
    Returns:
      DataFrame with the `by` columns and n, failed, nonfinite, floor, gap, gap_lo, gap_hi,
      gap_mcse (the larger Monte Carlo standard error of the two ends),
      levels (fewest seed levels of a varying stream), method.
    """
    require(runs, (*by, "status", outcome, "loss_floor"), "loss_gap")
    rows = []
    for key, g in _groups(runs, by):
        ok = ok_runs(g)
        y = ok[outcome].to_numpy(np.float64)
        finite = crossed.finite_runs(g, outcome)
        lay = crossed.layout(finite, tuple(streams))
        ci = crossed.mean_interval(
            finite[outcome].to_numpy(np.float64), lay, level=level, draws=draws, seed=seed
        )
        rows.append(
            key
            | dict(n=len(ok), failed=len(g) - len(ok), nonfinite=int((~np.isfinite(y)).sum()))
            | dict(floor=ok["loss_floor"].median(), gap=ci.estimate, gap_lo=ci.lo, gap_hi=ci.hi)
            | dict(gap_mcse=max(ci.lo_se, ci.hi_se))
            | dict(levels=min(lay.levels, default=1), method=ci.method)
        )
    return pd.DataFrame(rows)


def paired_difference(
    runs: pd.DataFrame,
    baseline: str,
    *,
    outcome: str = "loss_gap",
    by: str = "cell",
    streams: Sequence[str] = STREAMS,
    level: float = 0.95,
    draws: int = crossed.DRAWS,
    seed: int = 0,
) -> pd.DataFrame:
    """Each group's mean outcome minus the baseline group's, paired on the seeds they share.

        diff = mean over shared seeds s of (outcome(group, s) - outcome(baseline, s))

    Cells of a sweep usually share their seeds, so the seed-to-seed spread that both cells
    feel cancels in the difference, and its interval is much tighter than two per-cell
    intervals side by side. Pairing and interval: `crossed.paired_layout` (streams with the
    same levels in both cells; each cell averaged over its other streams) and
    `crossed.mean_interval` over the levels of each paired stream (seeds as random effects;
    the t-interval for seed triples (i, i, i)). Only runs with a finite outcome enter. One
    interval per row at `level`: for a family-wise statement use `verdicts.verdict`.

    Args:
      baseline: the value of `by` (a cell label) that every group is compared with.
      outcome: the column compared. by: the grouping column. streams: the seed streams.
      level: coverage. draws, seed: Monte Carlo size and seed.
    Returns:
      DataFrame with `by`, pairs, diff, diff_lo, diff_hi, diff_mcse (the larger Monte Carlo
      standard error of the two ends), and `verdict`: "higher" or "lower" when the interval
      excludes 0, "no evidence" when it contains 0 (an effect may still be there), each only
      with the deciding end `crossed.MC_SES` standard errors clear of 0; where it is not, the
      interval is redrawn with 4 times the draws (`montecarlo.more_draws`) up to
      `MAX_DRAWS_FACTOR` times `draws`, and then "undecided",
      "too few seeds" (fewer than 3 levels of a paired stream, or nothing to pair
      on), "baseline" for the baseline itself.
    """
    require(runs, (by, "status", outcome), "paired_difference")
    groups = {key[by]: g for key, g in _groups(runs, (by,))}
    if baseline not in groups:
        raise ValueError(f"paired_difference: no {by} {baseline!r}; have {list(groups)}")
    rows = []
    for name, g in groups.items():
        d, lay = crossed.paired_layout(groups[baseline], g, outcome, streams)
        if d is None:
            rows.append({by: name} | dict(pairs=0, diff=NAN, diff_lo=NAN, diff_hi=NAN))
            rows[-1]["diff_mcse"] = NAN
            rows[-1]["verdict"] = "too few seeds"
            continue
        ci = more_draws(
            lambda n: crossed.mean_interval(d, lay, level=level, draws=n, seed=seed),  # noqa: B023
            draws,
            MAX_DRAWS_FACTOR * draws,
        )
        if name == baseline:
            verdict = "baseline"
        elif not (np.isfinite(ci.lo) and np.isfinite(ci.hi)):
            verdict = "too few seeds"
        else:
            verdict = crossed.side_word(ci.lo, ci.hi, ci.lo_se, ci.hi_se)
        rows.append(
            {by: name}
            | dict(pairs=len(d), diff=ci.estimate, diff_lo=ci.lo, diff_hi=ci.hi)
            | dict(diff_mcse=max(ci.lo_se, ci.hi_se), verdict=verdict)
        )
    return pd.DataFrame(rows)


def _tokens(rows: pd.DataFrame) -> np.ndarray:
    """Tokens to target of runs that have a target; never reached (NaN) becomes +inf."""
    rows = rows[np.isfinite(rows["target_loss"].to_numpy(np.float64))]
    t = rows["tokens_to_target"].to_numpy(np.float64)
    return np.where(np.isnan(t), np.inf, t)


def tokens_to_target(
    runs: pd.DataFrame,
    by: Sequence[str] = ("cell",),
    *,
    baseline: Mapping[str, Any] | str | None = None,
    match: Sequence[str] = (),
    stat: Stat = np.median,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Tokens to reach the target loss per group and the overhead against a baseline.

        tokens   = stat over seeds of T,  T = tokens_to_target, or +inf when never reached
        overhead = exp(mean log T - mean log T_baseline) - 1   (a ratio of geometric means;
                   Cim et al. 2026, Table 1, print overheads as +8 % = 0.08)

    Never-reached runs stay in as +inf: the median is finite while more than half of the seeds
    reach the target, and is inf ("never") otherwise; `never` counts them. Intervals: the median's
    from order statistics (`median_interval`: distribution-free, at least `level`; [min, max]
    at 6-8 seeds; none below 6), another `stat`'s a bootstrap over seeds (`bootstrap_ci`, with
    its Monte Carlo error in `tokens_mcse`; 0 for the median's). The overhead's is Welch's
    t-interval on the logs of the two groups' runs (`log_ratio_interval`: no Monte Carlo
    error; its coverage on bimodal crossings at 8 runs per group is simulated in
    tests/analysis/test_tokens_coverage.py). Where some but not all runs of a group or its
    baseline never reach, the geometric mean is inf and the overhead is the ratio of medians
    with `ratio_ci`'s interval (percentile, Monte Carlo error in `overhead_mcse`; not
    coverage-tested, read as optimistic); every run never reaching gives inf. The baseline
    group compared with itself has overhead exactly 0. Each overhead interval is at `level` on
    its own (`family` 1).

    Args:
      by: grouping columns (default one group per sweep cell).
      baseline: the baseline runs, as {column: value} (e.g. {"recipe": "fp8"}); a string means
        {by[0]: baseline}. None: no overhead columns.
      match: columns on which each group is compared with the baseline runs that share its
        values (e.g. ("lr",): every recipe against the baseline at its own learning rate).
      stat, n_boot, level, seed: as in `bootstrap_ci` (the tokens column, and the overhead
        where some runs never reach).
    Returns:
      DataFrame with the `by` columns and n, failed, no_target (runs without a target), reached,
      never, tokens, tokens_lo, tokens_hi, tokens_mcse and, with a baseline, overhead,
      overhead_lo, overhead_hi, overhead_mcse, overhead_word ("higher" / "lower" when the
      interval excludes 0, "no evidence" when it contains it, "undecided" within its Monte
      Carlo error, "baseline", "no interval"), family (1) and baseline (True for the baseline
      group itself).
    """
    if isinstance(baseline, str):
        baseline = {by[0]: baseline}
    need = (*by, "status", "target_loss", "tokens_to_target", *(baseline or {}), *match)
    require(runs, need, "tokens_to_target")
    ok_all = ok_runs(runs)
    rows = []
    for key, g in _groups(runs, by):
        ok = ok_runs(g)
        t = _tokens(ok)
        if stat is np.median:
            ci, mcse = median_interval(t, level), 0.0
        else:
            ci = bootstrap_ci(t, stat, n_boot=n_boot, level=level, seed=seed)
            mcse = max(ci.lo_se, ci.hi_se)
        row = key | dict(n=len(ok), failed=len(g) - len(ok), no_target=len(ok) - len(t))
        row |= dict(reached=int(np.isfinite(t).sum()), never=int(np.isinf(t).sum()))
        row |= dict(tokens=ci.estimate, tokens_lo=ci.lo, tokens_hi=ci.hi, tokens_mcse=mcse)
        if baseline is not None:
            sel = np.ones(len(ok_all), bool)
            for col, value in baseline.items():
                sel &= (ok_all[col] == value).to_numpy()
            for col in match:
                sel &= (ok_all[col] == ok[col].iloc[0]).to_numpy() if len(ok) else False
            base = ok_all[sel]
            is_base = bool(len(base)) and set(base.index) == set(ok.index)
            oh = _overhead(t, _tokens(base), is_base, level, n_boot, seed)
            word = "no interval" if np.isnan([oh.lo, oh.hi]).any() else side_word(*oh[1:])
            row |= dict(overhead=oh.estimate, overhead_lo=oh.lo, overhead_hi=oh.hi)
            row |= dict(overhead_mcse=max(oh.lo_se, oh.hi_se))
            row |= dict(overhead_word="baseline" if is_base else word, family=1, baseline=is_base)
        rows.append(row)
    return pd.DataFrame(rows)


def _overhead(t, base, is_base: bool, level: float, n_boot: int, seed: int) -> MCInterval:
    """The overhead of tokens t against the baseline's (see `tokens_to_target`)."""
    if is_base:
        return MCInterval(0.0, 0.0, 0.0)
    some_never = np.isinf(t).any() or np.isinf(base).any()
    if some_never and not (np.isinf(t).all() or np.isinf(base).all()):
        # a geometric mean with never-reached runs is inf; the ratio of medians is not
        return ratio_ci(t, base, np.median, n_boot=n_boot, level=level, seed=seed)
    return MCInterval(*log_ratio_interval(t, base, level))


def retarget(runs: pd.DataFrame, metrics: pd.DataFrame, series: str = "loss") -> pd.DataFrame:
    """The runs with `tokens_to_target` read again from another stored per-step series, at each
    run's own target_loss, target_window and tokens_per_step: the tokens consumed when the mean
    of the last `target_window` values first reaches `target_loss` (NaN: never; a NaN value never
    counts as reached), as the trainer computes it (`Config.target_on`).

    With series="loss" the runs of `target_on="hp"` answer what the training loss under their
    own recipe would have said, on the same runs: the gap between the two readings is the
    forward's quantization error that the training loss counts as slower learning.

    Args:
      runs: a runs table with run_id, status, target_loss, target_window, tokens_per_step.
      metrics: the long metrics table (run_id, step, metric, value) of the same folder.
      series: the per-step series to read ("loss", "loss_hp").
    Raises:
      ValueError: a finished run without that series in `metrics`.
    """
    require(
        runs, ("run_id", "status", "target_loss", "target_window", "tokens_per_step"), "retarget"
    )
    rows = metrics[metrics["metric"] == series].sort_values(["run_id", "step"])
    by_run = {rid: g["value"].to_numpy(np.float64) for rid, g in rows.groupby("run_id")}
    ok = runs["status"] == "ok"
    missing = sorted(set(runs.loc[ok, "run_id"]) - set(by_run))
    if missing:
        raise ValueError(
            f"retarget: {len(missing)} finished run(s) have no {series!r} series in metrics "
            f"(first: {missing[0]}); series there: {sorted(metrics['metric'].unique())[:8]}"
        )
    tokens = [
        _first_crossing(by_run[r.run_id], r.target_loss, int(r.target_window), r.tokens_per_step)
        if is_ok
        else np.nan
        for r, is_ok in zip(runs.itertuples(), ok, strict=True)
    ]
    return runs.assign(tokens_to_target=np.asarray(tokens, np.float64))


def _first_crossing(values: np.ndarray, target: float, window: int, tokens_per_step) -> float:
    # the trainer's `fp4lab.train.summary.tokens_to_target`, which analysis may not import (it
    # depends on schema alone); tests/analysis/test_retarget.py holds the two to the same bits
    if not np.isfinite(target) or len(values) < window:
        return np.nan
    smooth = np.convolve(values, np.ones(window) / window, mode="valid")  # steps i..i+window-1
    hit = np.flatnonzero(smooth <= target)
    return float((hit[0] + window) * tokens_per_step) if len(hit) else np.nan


def default_baseline(runs: pd.DataFrame) -> tuple[dict | None, list[str]]:
    """The baseline and matching columns that the standard figures and report use.

    Baseline: the first recipe of BASELINE_RECIPES present among several recipes (None if
    none is), without per-GEMM or backward overrides where some of its runs have them. Match:
    the other varying config columns on which the baseline runs themselves vary (a baseline
    swept over lr is compared lr by lr; one run at a single setting is the baseline for all).
    Returns:
      (baseline, match), ready for `tokens_to_target(runs, baseline=..., match=...)`.
    """
    recipes = set(runs["recipe"].dropna()) if "recipe" in runs.columns else set()
    found = next((r for r in BASELINE_RECIPES if r in recipes), None)
    if found is None or len(recipes) < 2:
        return None, []
    baseline = {"recipe": found}
    base = runs[runs["recipe"] == found]
    # the plain recipe, where some runs of it also carry per-GEMM or backward overrides
    plain = {c: v for c, v in (("gemms", "[]"), ("backward", "")) if c in runs.columns}
    pure = base
    for c, v in plain.items():
        pure = pure[pure[c].astype(str) == v]
    if 0 < len(pure) < len(base):
        baseline, base = baseline | plain, pure
    match = [
        c for c in design_factors(runs) if c not in baseline and base[c].astype(str).nunique() > 1
    ]
    return baseline, match


def with_family(table: pd.DataFrame, family: int | None = None) -> pd.DataFrame:
    """The table with a `family` column: how many intervals its Bonferroni level is shared
    over (each row's level is 1 - (1 - level) / family), so that text quoting the table can
    quote the family from it. Default: the `comparisons` a `verdicts.verdict` table counted
    (its attrs); 1 for a table of intervals each at its own level."""
    if family is None:
        family = table.attrs["comparisons"]
    return table.assign(family=int(family))


def fixed_rows(verdict_table: pd.DataFrame) -> pd.DataFrame:
    """The fixed rows of a `verdicts.verdict` table as the studies write them: term, effect,
    lo, hi, the Monte Carlo errors of the ends (0 for a t-interval), verdict and family (the
    rows of the whole verdict, random rows included, that its Bonferroni level covers)."""
    fixed = verdict_table[verdict_table["kind"] == "fixed"][FIXED]
    return with_family(fixed, verdict_table.attrs["comparisons"])
