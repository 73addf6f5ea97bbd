"""Which design factors of a sweep matter: shares of variance of a main-effects model.

a factor's share of variance           omega^2 of a main-effects model, wild bootstrap

This model treats every factor as fixed and pools interactions into the residual: right for
design factors swept on independent seeds, wrong for crossed seed streams (a quant seed is
different noise under every init and data seed, so its effect is an interaction). Seed streams
go to `fp4lab.analysis.components.variance_components`, and the verdict on a sweep is
`fp4lab.analysis.verdicts.verdict`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fp4lab.analysis.columns import require
from fp4lab.analysis.frames import IDENTITY, SEEDS, SUMMARIES, ok_runs
from fp4lab.analysis.intervals import percentile_interval

__all__ = ["design_factors", "seed_factors", "variance_decomposition"]

NAN = float("nan")


def design_factors(runs: pd.DataFrame) -> list[str]:
    """Config columns that vary between runs (all columns but identity, seeds and summaries)."""
    skip = set(IDENTITY) | set(SEEDS) | set(SUMMARIES)
    return [c for c in runs.columns if c not in skip and runs[c].astype(str).nunique() > 1]


def _share(part: float, total: float) -> float:
    """part / total; NaN where the total sum of squares is 0 (every outcome the same)."""
    return part / total if total > 0 else NAN


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

    Assumptions: runs are independent (not so for crossed seed streams: see the module
    docstring); interactions (recipe x lr, recipe x seed, ...) are
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
    require(runs, ("status", outcome, *(factors or ())), "variance_decomposition")
    ok = ok_runs(runs)
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
            row |= dict(eta2=_share(point[f"ss:{f}"], point["sst"]), share=point[f])
            row |= dict(
                zip(("share_lo", "share_hi"), percentile_interval(boots[f], level), strict=True)
            )
            row |= dict(effect=point[f"effect:{f}"])
            effect = percentile_interval(boots[f"effect:{f}"], level)
            row |= dict(zip(("effect_lo", "effect_hi"), effect, strict=True))
        rows.append(row)
    lo, hi = percentile_interval(boots["residual"], level)
    rows.append(
        dict(factor="residual", levels=n, df=df_res, eta2=_share(point["rss"], point["sst"]))
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
