"""Statistics of a sweep: divergence, tokens to target, loss gaps, which factors matter.

Reads only the results store's two tables (never the training code):

    runs      one row per run (sweep cell x seed triple): identity, seeds, config, summaries
    metrics   long table (run_id, step, metric, value)

Every estimate comes with an interval, and the interval says how it was made:

    proportions (divergence rate)          Wilson score interval
    a statistic over seeds (gap, tokens)   percentile bootstrap over runs, seeded
    a difference between two cells         the same, over pairs of runs with the same seeds
    a factor's share of variance           omega^2 of a main-effects model, wild bootstrap

Only runs with status "ok" give outcomes; every table counts the others. A run that never
reaches the target counts as needing infinitely many tokens: it is never silently dropped.
Bootstraps are seeded (`seed=`): the same call gives the same interval.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from statistics import NormalDist
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from fp4lab.store import SEED_COLUMNS

SEEDS = SEED_COLUMNS  # seed_init, seed_data, seed_quant
IDENTITY = ("run_id", "experiment", "cell", "status")
SUMMARIES = (
    "final_loss",
    "final_train_loss",
    "eval_loss",
    "loss_floor",
    "loss_gap",
    "diverged",
    "divergence_step",
    "divergence_kind",
    "tokens_to_target",
    "target_loss",
    "tokens_per_step",
    "wall_s",
    "compile_s",
)
QUANT_STATS = ("rel_err", "bias", "flush", "saturated", "underflow", "map4")
GRAD_STATS = ("cos", "rel_norm", "gnr", "below_sqrt3")
BASELINE_RECIPES = ("bf16", "fp32", "fp8")  # default overhead baseline: the first one swept
Stat = Callable[..., Any]  # a numpy reduction, called as stat(array, axis=-1)
NAN = float("nan")


class Interval(NamedTuple):
    """A point estimate and the two ends of its interval."""

    estimate: float
    lo: float
    hi: float


# ---------------------------------------------------------------------------------------------
# Intervals.


def wilson_interval(k, n, level: float = 0.95) -> Interval:
    """Wilson score interval for a proportion k/n (Wilson 1927).

        p = k/n,  z = Phi^-1((1 + level)/2)
        centre = (p + z^2/(2n)) / (1 + z^2/n)
        half   = z / (1 + z^2/n) * sqrt(p(1 - p)/n + z^2/(4n^2))

    Unlike the normal approximation it stays inside [0, 1] and is not degenerate at k = 0 or
    k = n (0 of 5 diverged gives [0, 0.43], not [0, 0]).

    Args:
      k: successes (scalar or array). n: trials (same shape; n = 0 gives NaN).
      level: coverage of the interval.
    Returns:
      Interval(p, lo, hi), floats for scalar input, arrays otherwise.
    """
    k, n = np.asarray(k, np.float64), np.asarray(n, np.float64)
    z = NormalDist().inv_cdf(0.5 + level / 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = k / n
        denom = 1 + z**2 / n
        centre = (p + z**2 / (2 * n)) / denom
        half = z / denom * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    lo, hi = np.clip(centre - half, 0, 1), np.clip(centre + half, 0, 1)
    if p.ndim == 0:
        return Interval(float(p), float(lo), float(hi))
    return Interval(p, lo, hi)


def percentile_interval(boots: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The (1-level)/2 and (1+level)/2 quantiles of bootstrap replicates.

    Replicates may be +-inf (a statistic over runs that never reached a target); quantiles are
    taken without interpolation so that inf stays inf. NaN replicates are undefined (e.g. inf/inf):
    when more than (1-level)/2 of them are NaN, either end could lie among them and the interval
    is (NaN, NaN).
    """
    boots = np.asarray(boots, np.float64).ravel()
    alpha = (1 - level) / 2
    defined = boots[~np.isnan(boots)]
    if defined.size == 0 or defined.size < (1 - alpha) * boots.size:
        return NAN, NAN
    lo, hi = np.quantile(defined, [alpha, 1 - alpha], method="inverted_cdf")
    return float(lo), float(hi)


def bootstrap_ci(
    values,
    stat: Stat = np.mean,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
    min_n: int = 2,
) -> Interval:
    """Percentile bootstrap interval of stat(values) (Efron & Tibshirani 1993, ch. 13).

    Draws `n_boot` resamples of the n values with replacement (numpy's PCG64 seeded with
    `seed`, so the same call gives the same interval), computes the statistic on each and
    takes the (1-level)/2 and (1+level)/2 quantiles. Assumes the values are exchangeable
    (e.g. one per seed of a cell); with few seeds the percentile interval is too narrow
    rather than too wide, so read it as optimistic.

    Args:
      values: 1-D data; +-inf allowed (see `percentile_interval`), NaN is the caller's to remove.
      stat: a reduction called as stat(array, axis=-1), e.g. np.mean, np.median.
      n_boot: number of resamples. level: coverage. seed: the resampling seed.
      min_n: below this many values the interval is (NaN, NaN): one seed has no spread.
    Returns:
      Interval(stat(values), lo, hi).
    """
    x = np.asarray(values, np.float64).ravel()
    if x.size == 0:
        return Interval(NAN, NAN, NAN)
    estimate = float(stat(x, axis=-1))
    if x.size < min_n:
        return Interval(estimate, NAN, NAN)
    idx = np.random.default_rng(seed).integers(0, x.size, size=(n_boot, x.size))
    return Interval(estimate, *percentile_interval(stat(x[idx], axis=-1), level))


def ratio_ci(
    num,
    den,
    stat: Stat = np.median,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Bootstrap interval of stat(num) / stat(den) - 1, the two samples resampled independently.

    Independent (unpaired) resampling ignores any pairing of seeds between the two samples,
    which makes the interval conservative when runs that share seeds are correlated. A ratio
    inf/inf (neither sample reaches) is undefined (NaN); finite/inf is -1.
    """
    a, b = np.asarray(num, np.float64).ravel(), np.asarray(den, np.float64).ravel()
    if a.size == 0 or b.size == 0:
        return Interval(NAN, NAN, NAN)
    with np.errstate(invalid="ignore", divide="ignore"):
        estimate = float(stat(a) / stat(b) - 1)
        if min(a.size, b.size) < 2:
            return Interval(estimate, NAN, NAN)
        rng = np.random.default_rng(seed)
        ia = rng.integers(0, a.size, size=(n_boot, a.size))
        ib = rng.integers(0, b.size, size=(n_boot, b.size))
        boots = stat(a[ia], axis=-1) / stat(b[ib], axis=-1) - 1
    return Interval(estimate, *percentile_interval(boots, level))


# ---------------------------------------------------------------------------------------------
# Per-cell tables.


def _ok(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["status"] == "ok"]


def _groups(runs: pd.DataFrame, by: Sequence[str]) -> Iterable[tuple[dict, pd.DataFrame]]:
    """(key dict, rows) per group of `by`, in order of first appearance; NaN keys kept."""
    for key, rows in runs.groupby(list(by), sort=False, dropna=False):
        yield dict(zip(by, key, strict=True)), rows


def divergence_rate(runs: pd.DataFrame, by: Sequence[str] = ("cell",), *, level=0.95):
    """Fraction of runs that diverged per group, with a Wilson interval.

    rate = diverged / n over the runs with status "ok" (a failed run is neither a divergence nor
    a success: it is counted in `failed` and left out of n).

    Returns:
      DataFrame with the `by` columns and n, failed, diverged, nonfinite, spike (by kind), rate,
      rate_lo, rate_hi, and the median divergence step among the runs that diverged.
    """
    rows = []
    for key, g in _groups(runs, by):
        ok = _ok(g)
        div = ok["diverged"].astype(bool)
        kind = ok["divergence_kind"].astype(str)
        rate = wilson_interval(int(div.sum()), len(ok), level)
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
    stat: Stat = np.mean,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Gap of the final loss to the task's optimum per group, with a bootstrap interval over seeds.

        gap = stat over seeds of (final_loss - loss_floor)

    The floor is exact for the synthetic tasks (e.g. a Markov source's entropy rate), so a gap
    of 0 means the task is solved. Runs with a non-finite outcome (a diverged run's NaN loss)
    cannot enter a mean: they are counted in `nonfinite`, and the interval is over the rest.

    Args:
      outcome: the column summarised ("loss_gap"; "final_loss" when no floor is known).
      stat, n_boot, level, seed: as in `bootstrap_ci`.
    Returns:
      DataFrame with the `by` columns and n, failed, nonfinite, floor, gap, gap_lo, gap_hi.
    """
    rows = []
    for key, g in _groups(runs, by):
        ok = _ok(g)
        y = ok[outcome].to_numpy(np.float64)
        ci = bootstrap_ci(y[np.isfinite(y)], stat, n_boot=n_boot, level=level, seed=seed)
        rows.append(
            key
            | dict(n=len(ok), failed=len(g) - len(ok), nonfinite=int((~np.isfinite(y)).sum()))
            | dict(floor=ok["loss_floor"].median(), gap=ci.estimate, gap_lo=ci.lo, gap_hi=ci.hi)
        )
    return pd.DataFrame(rows)


def paired_difference(
    runs: pd.DataFrame,
    baseline: str,
    *,
    outcome: str = "loss_gap",
    by: str = "cell",
    stat: Stat = np.mean,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Each group's outcome minus the baseline group's, paired on the seed triple.

        diff_s = outcome(group, seeds s) - outcome(baseline, seeds s),   s in the shared triples

    Cells of a sweep usually share their seed triples (same init, data and quant seeds), so the
    seed-to-seed spread that both cells feel cancels in the difference, and the interval of
    stat(diff) (percentile bootstrap over the pairs) is much tighter than two per-cell intervals
    side by side. Only the pairs where both runs finished with a finite outcome enter.

    Args:
      baseline: the value of `by` (a cell label) that every group is compared with.
      outcome: the column compared. by: the grouping column.
      stat, n_boot, level, seed: as in `bootstrap_ci`.
    Returns:
      DataFrame with `by`, pairs, diff, diff_lo, diff_hi, and `verdict`: "higher" or "lower"
      when the interval excludes 0, "no evidence" when it contains 0 (an effect may still be
      there), "baseline" for the baseline itself.
    """
    ok = _ok(runs)
    ok = ok[np.isfinite(ok[outcome].to_numpy(np.float64))]
    if baseline not in set(runs[by]):
        raise ValueError(f"paired_difference: no {by} {baseline!r}; have {list(runs[by].unique())}")
    base = ok[ok[by] == baseline].set_index(list(SEEDS))[outcome]
    if base.index.has_duplicates:
        raise ValueError(f"paired_difference: {baseline!r} has repeated seed triples")
    rows = []
    for key, g in _groups(runs, (by,)):
        y = ok.loc[ok.index.intersection(g.index)].set_index(list(SEEDS))[outcome]
        shared = y.index.intersection(base.index)
        d = (y.loc[shared] - base.loc[shared]).to_numpy(np.float64)
        ci = bootstrap_ci(d, stat, n_boot=n_boot, level=level, seed=seed)
        if key[by] == baseline:
            verdict = "baseline"
        elif not (np.isfinite(ci.lo) and np.isfinite(ci.hi)):
            verdict = "too few pairs"
        else:
            verdict = "higher" if ci.lo > 0 else "lower" if ci.hi < 0 else "no evidence"
        rows.append(
            key
            | dict(pairs=len(d), diff=ci.estimate, diff_lo=ci.lo, diff_hi=ci.hi, verdict=verdict)
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
        overhead = tokens / tokens_baseline - 1      (Cim et al. 2026, Table 1: +8 % = 0.08)

    Never-reached runs stay in as +inf: the median is finite while more than half of the seeds
    reach the target, and is inf ("never") otherwise; `never` counts them. Intervals: bootstrap
    over seeds (`bootstrap_ci`); the overhead resamples the group and its baseline independently
    (`ratio_ci`). The baseline group compared with itself has overhead exactly 0.

    Args:
      by: grouping columns (default one group per sweep cell).
      baseline: the baseline runs, as {column: value} (e.g. {"recipe": "fp8"}); a string means
        {by[0]: baseline}. None: no overhead columns.
      match: columns on which each group is compared with the baseline runs that share its
        values (e.g. ("lr",): every recipe against the baseline at its own learning rate).
      stat, n_boot, level, seed: as in `bootstrap_ci`.
    Returns:
      DataFrame with the `by` columns and n, failed, no_target (runs without a target), reached,
      never, tokens, tokens_lo, tokens_hi and, with a baseline, overhead, overhead_lo, overhead_hi
      and baseline (True for the baseline group itself).
    """
    ok_all = _ok(runs)
    if isinstance(baseline, str):
        baseline = {by[0]: baseline}
    rows = []
    for key, g in _groups(runs, by):
        ok = _ok(g)
        t = _tokens(ok)
        ci = bootstrap_ci(t, stat, n_boot=n_boot, level=level, seed=seed)
        row = key | dict(n=len(ok), failed=len(g) - len(ok), no_target=len(ok) - len(t))
        row |= dict(reached=int(np.isfinite(t).sum()), never=int(np.isinf(t).sum()))
        row |= dict(tokens=ci.estimate, tokens_lo=ci.lo, tokens_hi=ci.hi)
        if baseline is not None:
            sel = np.ones(len(ok_all), bool)
            for col, value in baseline.items():
                sel &= (ok_all[col] == value).to_numpy()
            for col in match:
                sel &= (ok_all[col] == ok[col].iloc[0]).to_numpy() if len(ok) else False
            base = ok_all[sel]
            is_base = bool(len(base)) and set(base.index) == set(ok.index)
            if is_base:
                oh = Interval(0.0, 0.0, 0.0)
            else:
                oh = ratio_ci(t, _tokens(base), stat, n_boot=n_boot, level=level, seed=seed)
            row |= dict(overhead=oh.estimate, overhead_lo=oh.lo, overhead_hi=oh.hi)
            row |= dict(baseline=is_base)
        rows.append(row)
    return pd.DataFrame(rows)


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


# ---------------------------------------------------------------------------------------------
# Which factors matter.


def design_factors(runs: pd.DataFrame) -> list[str]:
    """Config columns that vary between runs (all columns but identity, seeds and summaries)."""
    skip = set(IDENTITY) | set(SEEDS) | set(SUMMARIES)
    return [c for c in runs.columns if c not in skip and runs[c].astype(str).nunique() > 1]


def seed_factors(runs: pd.DataFrame) -> list[str]:
    """The seed streams that vary between runs."""
    return [c for c in SEEDS if c in runs.columns and runs[c].nunique() > 1]


def _basis(x: np.ndarray) -> np.ndarray:
    """Orthonormal basis (N x rank) of the column space of x (SVD, so aliasing is harmless)."""
    u, s, _ = np.linalg.svd(x, full_matrices=False)
    return u[:, s > s[0] * 1e-10 * max(x.shape)]


def variance_decomposition(
    runs: pd.DataFrame,
    outcome: str,
    factors: Sequence[str] | None = None,
    *,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Each factor's share of the variance of an outcome, with a bootstrap interval.

    Model: additive main effects of categorical factors (every distinct value is a level; lr is
    not given a trend), least squares on treatment-coded dummies,

        y_r = mu + sum_f a_f[level_f(r)] + e_r.

    Design factors (recipe, rules, lr, ...) and the seed streams (seed_init, seed_data,
    seed_quant) enter alike. Sums of squares are type II: SS_f = RSS(model without f) - RSS(full),
    which are the classical orthogonal sums on a balanced factorial and stay meaningful on a
    near-factorial one (a few failed runs). The share of f is Hays' omega squared,

        share_f  = (SS_f - df_f * MS_res) / (SS_tot + MS_res),    MS_res = RSS(full) / df_res,
        residual = N * MS_res / (SS_tot + MS_res),

    an estimate of the fraction of the outcome's population variance due to f. Unlike the raw
    eta^2 = SS_f / SS_tot (also reported) it is not inflated by noise: it is about 0, and may be
    negative, for a factor without effect; on a balanced design the shares and the residual sum
    to 1. `effect` is the spread (max - min) of f's fitted level effects, in outcome units.

    Interval: wild bootstrap (Wu 1986) of the fitted model, y* = y_hat + v * e / sqrt(1 - h)
    with Rademacher v, leverage h: it keeps the design exactly and allows each run its own noise
    variance (FP4 recipes are noisier than BF16). Percentile interval of each statistic.

    Assumptions: runs are independent; interactions (recipe x lr, recipe x seed, ...) are
    pooled into the residual; factors not listed are pooled too. Factors that always move
    together cannot be told apart: identical partitions of the runs (seed triples (i, i, i))
    become one row, "seed_init = seed_data = seed_quant"; a factor nested in another (recipe
    inside cell) gets df = 0, NaN shares and `confounded_with`, and the variance the two share
    is attributed to neither (the shares then sum to less than 1).

    Args:
      runs: the runs table; only status "ok" rows with a finite outcome are used.
      outcome: a numeric or boolean column (loss_gap, final_loss, divergence_step, diverged).
      factors: columns to attribute variance to; default all varying config and seed columns.
      n_boot, level, seed: bootstrap size, coverage and seed.
    Returns:
      DataFrame, one row per factor and a final "residual" row: factor, levels, df, eta2, share,
      share_lo, share_hi, effect, effect_lo, effect_hi, confounded_with. attrs: outcome, n,
      excluded (ok runs with a non-finite outcome), failed, df_res, sst, seeds (fewest distinct
      seed triples in any combination of the design factors).
    """
    ok = _ok(runs)
    y = ok[outcome].astype(np.float64).to_numpy()
    data, y = ok[np.isfinite(y)], y[np.isfinite(y)]
    n = len(y)
    if n < 2:
        raise ValueError(f"variance_decomposition: {n} run(s) with a finite {outcome!r}; need 2")
    factors = list(factors) if factors is not None else design_factors(ok) + seed_factors(ok)
    codes = {f: pd.factorize(data[f].astype(str))[0] for f in factors}
    classes = _alias_classes(codes)  # representative -> factors with the same partition
    blocks = {f: np.eye(codes[f].max() + 1)[codes[f], 1:] for f in classes}  # treatment coding
    one = np.ones((n, 1))
    design = np.hstack([one, *blocks.values()])
    q_full = _basis(design)
    q_drop = {
        f: _basis(np.hstack([one] + [b for g, b in blocks.items() if g != f])) for f in blocks
    }
    df = {f: q_full.shape[1] - q.shape[1] for f, q in q_drop.items()}
    df_res = n - q_full.shape[1]

    def statistics(y_bn):  # (B, N) outcomes -> {name: (B,)}
        y_bn = y_bn - y_bn.mean(-1, keepdims=True)
        sst = (y_bn**2).sum(-1)
        rss = sst - ((y_bn @ q_full) ** 2).sum(-1)
        ms = rss / df_res if df_res > 0 else np.full_like(rss, np.nan)
        out = {"sst": sst, "rss": rss, "residual": n * ms / (sst + ms)}
        beta = np.linalg.lstsq(design, y_bn.T, rcond=None)[0]  # (P, B)
        col = 1
        for f, q in q_drop.items():
            ss = sst - ((y_bn @ q) ** 2).sum(-1) - rss
            out[f] = (ss - df[f] * ms) / (sst + ms)
            out[f"ss:{f}"] = ss
            a = np.vstack([np.zeros((1, len(y_bn))), beta[col : col + blocks[f].shape[1]]])
            out[f"effect:{f}"] = a.max(0) - a.min(0)
            col += blocks[f].shape[1]
        return out

    with np.errstate(invalid="ignore", divide="ignore"):
        point = {k: v[0] for k, v in statistics(y[None]).items()}
        yc = y - y.mean()
        fitted = q_full @ (q_full.T @ yc)
        h = (q_full**2).sum(1)
        e = np.where(h < 1 - 1e-9, (yc - fitted) / np.sqrt(np.clip(1 - h, 1e-12, None)), 0.0)
        v = np.random.default_rng(seed).choice([-1.0, 1.0], size=(n_boot, n))
        boots = statistics(fitted + v * e)

    rows = []
    for f, members in classes.items():
        fixed_by = [g for g in classes if g != f and _determines(codes[g], codes[f])]
        row = dict(factor=" = ".join(members), levels=codes[f].max() + 1, df=df[f], eta2=NAN)
        row |= dict(share=NAN, share_lo=NAN, share_hi=NAN, effect=NAN, effect_lo=NAN)
        row |= dict(effect_hi=NAN, confounded_with=", ".join(fixed_by) if df[f] == 0 else "")
        if df[f]:
            row |= dict(eta2=point[f"ss:{f}"] / point["sst"], share=point[f])
            row |= dict(
                zip(("share_lo", "share_hi"), percentile_interval(boots[f], level), strict=True)
            )
            row |= dict(effect=point[f"effect:{f}"])
            effect = percentile_interval(boots[f"effect:{f}"], level)
            row |= dict(zip(("effect_lo", "effect_hi"), effect, strict=True))
        rows.append(row)
    lo, hi = percentile_interval(boots["residual"], level)
    rows.append(
        dict(factor="residual", levels=n, df=df_res, eta2=point["rss"] / point["sst"])
        | dict(share=point["residual"], share_lo=lo, share_hi=hi)
        | dict(effect=NAN, effect_lo=NAN, effect_hi=NAN, confounded_with="")
    )
    out = pd.DataFrame(rows)
    design_cols = [f for f in factors if f not in SEEDS]
    seed_cols = [c for c in SEEDS if c in data.columns]
    triples = data[design_cols + seed_cols].astype(str).drop_duplicates()
    seeds = triples.groupby(design_cols).size().min() if design_cols else len(triples)
    out.attrs = dict(outcome=outcome, n=n, excluded=len(ok) - n, failed=len(runs) - len(ok))
    out.attrs |= dict(df_res=df_res, sst=float(point["sst"]), seeds=int(seeds))
    return out


def _determines(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the levels (integer codes) a fix the levels b: each a-level has one b-level."""
    return len(np.unique(np.stack([a, b]), axis=1)[0]) == len(np.unique(a))


def _alias_classes(codes: dict[str, np.ndarray]) -> dict[str, list[str]]:
    """Factors grouped by identical partitions of the runs (e.g. seed triples (i, i, i))."""
    classes: dict[str, list[str]] = {}
    for f, c in codes.items():
        rep = next((g for g in classes if c.max() > 0 and _same(codes[g], c)), f)
        classes.setdefault(rep, []).append(f)
    return classes


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return _determines(a, b) and _determines(b, a)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def verdict(
    frame: pd.DataFrame,
    outcome: str = "loss_gap",
    factors: Sequence[str] | None = None,
    *,
    min_seeds: int = 3,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """One table saying which factors of a sweep matter for an outcome, with the numbers.

    Runs `variance_decomposition` and reads each factor's share interval, claiming no more than
    the seeds allow. In order, a factor is

        "not varied"        it has one level in the data
        "confounded with X" its levels are fixed by another factor's (no separate estimate)
        "too few seeds"     fewer than `min_seeds` seed triples in some design cell, or fewer
                            than 2 residual degrees of freedom: no honest noise estimate
        "matters"           the lower end of its share interval is above 0
        "no evidence"       otherwise: the data are consistent with no effect (which is not
                            evidence of no effect: more seeds narrow the interval)

    Args:
      frame: the runs table. outcome, factors, n_boot, level, seed: as in
        `variance_decomposition`. min_seeds: fewest seed triples per design cell to judge.
    Returns:
      DataFrame: factor, verdict, share, share_lo, share_hi, effect, effect_lo, effect_hi,
      levels, df, n, seeds, evidence (the numbers in words). Last row: the residual.
    """
    vd = variance_decomposition(frame, outcome, factors, n_boot=n_boot, level=level, seed=seed)
    a = vd.attrs
    verdicts, evidence = [], []
    for r in vd.itertuples():
        numbers = f"share {_pct(r.share)} [{_pct(r.share_lo)}, {_pct(r.share_hi)}]"
        if r.factor == "residual":
            verdicts.append("(residual)")
            evidence.append(f"{numbers}: noise, interactions and unlisted factors")
        elif r.levels < 2:
            verdicts.append("not varied")
            evidence.append("one level in the data")
        elif r.df == 0:
            verdicts.append(f"confounded with {r.confounded_with}".strip())
            evidence.append("its levels are fixed by other factors")
        elif a["seeds"] < min_seeds or a["df_res"] < 2:
            verdicts.append("too few seeds")
            evidence.append(f"{a['seeds']} seed triple(s) per cell, {min_seeds} needed")
        elif a["sst"] == 0:
            verdicts.append("no evidence")
            evidence.append(f"{outcome} is the same in every run")
        else:
            verdicts.append("matters" if r.share_lo > 0 else "no evidence")
            spread = f"levels span {r.effect:.3g} [{r.effect_lo:.3g}, {r.effect_hi:.3g}]"
            evidence.append(f"{numbers}; {spread}")
    cols = ["factor", "share", "share_lo", "share_hi", "effect", "effect_lo", "effect_hi"]
    out = vd[cols + ["levels", "df"]].assign(n=a["n"], seeds=a["seeds"], evidence=evidence)
    out.insert(1, "verdict", verdicts)
    out.attrs = dict(a)
    return out


# ---------------------------------------------------------------------------------------------
# The metrics table.

_QUANT = r"^quant/(?P<layer>[^/]+)/(?P<gemm>[^/]+)/(?P<operand>[^/]+)/(?P<stat>[^/]+)$"
_GRAD = r"^grad/(?P<layer>[^/]+)/(?P<stat>[^/]+)$"


def scalar_metric(metrics: pd.DataFrame, name: str) -> pd.DataFrame:
    """Rows (run_id, step, value) of one scalar metric ("loss", "grad_norm", "eval_loss", ...)."""
    rows = metrics[metrics["metric"] == name]
    return rows[["run_id", "step", "value"]].reset_index(drop=True)


def _parse(metrics: pd.DataFrame, pattern: str, index: list[str], wide: bool) -> pd.DataFrame:
    prefix = pattern[1 : pattern.index("/") + 1]
    rows = metrics[metrics["metric"].str.startswith(prefix)]
    names = pd.Series(rows["metric"].unique())
    keys = names.str.extract(pattern).set_axis(names.to_numpy())  # parse each name once
    keys = keys.dropna()
    rows = rows[rows["metric"].isin(keys.index)]
    parts = keys.loc[rows["metric"]].set_axis(rows.index)
    tidy = pd.concat([rows[["run_id", "step"]], parts, rows[["value"]]], axis=1)
    tidy = tidy.reset_index(drop=True)
    if not wide:
        return tidy
    out = tidy.set_index(["run_id", "step", *index, "stat"])["value"].unstack("stat")
    return out.reset_index().rename_axis(columns=None)


def quant_telemetry(metrics: pd.DataFrame, *, wide: bool = False) -> pd.DataFrame:
    """Quantizer statistics, parsed from keys quant/<layer>/<gemm>/<operand>/<stat>.

    Returns tidy rows (run_id, step, layer, gemm, operand, stat, value), or with wide=True one
    row per (run_id, step, layer, gemm, operand) and one column per statistic (rel_err, bias,
    flush, saturated, underflow, map4; see fp4lab.telemetry for their formulas).
    """
    return _parse(metrics, _QUANT, ["layer", "gemm", "operand"], wide)


def grad_telemetry(metrics: pd.DataFrame, *, wide: bool = False) -> pd.DataFrame:
    """Shadow-gradient statistics, parsed from keys grad/<layer>/<stat>.

    Returns tidy rows (run_id, step, layer, stat, value), or with wide=True one row per
    (run_id, step, layer) with columns cos, rel_norm, gnr (+inf: no quantization noise),
    below_sqrt3.
    """
    return _parse(metrics, _GRAD, ["layer"], wide)


def attach(frame: pd.DataFrame, runs: pd.DataFrame, columns: Sequence[str] = ("cell",)):
    """`frame` (with a run_id column) joined with the given columns of the runs table."""
    return frame.merge(runs[["run_id", *columns]], on="run_id", how="left")


def layer_order(layers: Iterable[str]) -> list[str]:
    """Layer paths in natural order: blocks.2 before blocks.10."""

    def key(path: str):
        return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path)]

    return sorted(set(layers), key=key)
