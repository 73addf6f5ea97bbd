"""Stage 1's scores: per layer and GEMM, from the variants `fp4lab.diagnosis.probe` measures.

Every score is "higher = more sensitive", per sample (a checkpoint, a batch and a quant seed):

    own_error            the GEMM's own error: ||r_q - r|| / ||r|| of its result (Fprop y,
                         Dgrad dx, Wgrad dw) when it alone is quantized (its inputs are the
                         shadow's)
    alone_fwd            mean over layers of the relative drift of their outputs when the GEMM
                         alone is quantized (the forward drift it causes downstream)
    alone_bwd            the same for the cotangents arriving at the layers (backward drift)
    alone_grad_rel       ||g_v - g|| / ||g|| of the full gradient, the GEMM alone quantized
    alone_grad_angle     1 - cos(g_v, g), the same
    alone_update_loss    share of one gradient step's first-order loss decrease lost
                         (1 - <g, g_v> / ||g||^2), the same
    alone_step_loss      the share of one optimizer step's first-order loss decrease (the
                         high-precision loss's gradient g, on the batch) that a step along g_v
                         loses: (step_v - step) / -step = 1 - <g, u(g_v)> / <g, u(g)>, u the
                         optimizer's first update (`probe.Probe`: Adam's first step moves
                         every weight by lr in the sign of its gradient, so an error on weights
                         the loss does not feel costs nothing, and a sign flipped on a weight
                         it does costs twice that weight's |g|: under Adam the score is >= 0
                         up to eps), the same
    alone_loss           loss_v - loss (the forward's effect on the loss), the same; negative
                         where the quantized forward fits the batch better than the shadow
                         (weights trained under FP4 have adapted to its rounding)
    removed_fwd          alone_fwd's measure of the all-FP4 model minus that of the model with
                         only this GEMM kept in high precision: the drift keeping it removes
    removed_bwd, removed_grad_rel, removed_update_loss, removed_step_loss   the same for
                         those measures

Each row also carries the all-FP4 model's own `fp4_step_loss` and `fp4_update_loss` (the same
in every row of a sample): the whole of what a share score is a share of (`TOTALS`).

`summarize` gives each score's mean over the samples with a t-interval (the samples are
treated as independent draws; they are a crossed design of checkpoints, batches and quant
seeds, so the interval is a guide, narrower than one that models the crossing), and
`agreement` the rank correlation (Spearman) of the scores' means across the layer x GEMM
table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fp4lab.analysis.intervals import fieller_interval, t_interval
from fp4lab.schema import GEMMS

__all__ = [
    "SCORES",
    "SHARES",
    "TOTALS",
    "DEFAULT",
    "sample_rows",
    "summarize",
    "agreement",
    "rank",
    "tied_at_top",
    "kept_gates",
    "kept_share",
]

SCORES = (
    "own_error",
    "alone_fwd",
    "alone_bwd",
    "alone_grad_rel",
    "alone_grad_angle",
    "alone_update_loss",
    "alone_step_loss",
    "alone_loss",
    "removed_fwd",
    "removed_bwd",
    "removed_grad_rel",
    "removed_update_loss",
    "removed_step_loss",
)
# scores that are shares of one step's loss decrease: drawn on one scale, (0, 1), for every model
SHARES = ("alone_update_loss", "alone_step_loss", "removed_update_loss", "removed_step_loss")
# the all-FP4 model's own measure of each share score: the whole its shares are shares of
TOTALS = {
    "alone_step_loss": "fp4_step_loss",
    "removed_step_loss": "fp4_step_loss",
    "alone_update_loss": "fp4_update_loss",
    "removed_update_loss": "fp4_update_loss",
}
DEFAULT = "alone_step_loss"  # the ranking score, validated on planted models (docs/diagnose.md)
_LANE = {"fprop": "y", "dgrad": "dx", "wgrad": "dw"}


def _mean_finite(a: np.ndarray) -> np.ndarray:
    """Mean over the last axis of the finite values (a layer whose shadow tensor is zero has an
    infinite relative drift and is left out)."""
    ok = np.isfinite(a)
    with np.errstate(invalid="ignore"):
        return np.where(ok, a, 0).sum(-1) / ok.sum(-1)


def sample_rows(out: dict, shadow: dict, sites, sample: dict) -> pd.DataFrame:
    """One row per layer and GEMM of one sample: its scores (module docstring).

    Args:
      out: `Probe.measure`'s metrics of `probe.variants(len(sites))`.
      shadow: the shadow's loss on the batch and its step's change (`Probe.measure`).
      sites: `Probe.sites`. sample: columns naming the sample (checkpoint, batch, quant).
    """
    n = len(sites)
    k = 3 * n
    fwd, bwd = _mean_finite(out["y"]), _mean_finite(out["dy"])
    angle = 1 - out["grad_cos"]
    with np.errstate(invalid="ignore", divide="ignore"):
        step = (out["step_loss"] - shadow["step"]) / -shadow["step"]
    rows = []
    for i, site in enumerate(sites):
        for j, gemm in enumerate(GEMMS):
            a, kept = 1 + 3 * i + j, 1 + k + 3 * i + j
            row = dict(sample) | {"layer": site.layer, "gemm": gemm}
            row |= {
                "own_error": out[_LANE[gemm]][a, i],
                "alone_fwd": fwd[a],
                "alone_bwd": bwd[a],
                "alone_grad_rel": out["grad_rel"][a],
                "alone_grad_angle": angle[a],
                "alone_update_loss": out["update_loss"][a],
                "alone_step_loss": step[a],
                "alone_loss": out["loss"][a] - shadow["loss"],
                "removed_fwd": fwd[0] - fwd[kept],
                "removed_bwd": bwd[0] - bwd[kept],
                "removed_grad_rel": out["grad_rel"][0] - out["grad_rel"][kept],
                "removed_update_loss": out["update_loss"][0] - out["update_loss"][kept],
                "removed_step_loss": step[0] - step[kept],
                "fp4_step_loss": step[0],
                "fp4_update_loss": out["update_loss"][0],
            }
            rows.append(row)
    return pd.DataFrame(rows)


def summarize(samples: pd.DataFrame, sites, *, level: float = 0.95) -> pd.DataFrame:
    """One row per layer and GEMM: depth, flops (of the GEMM, one forward), and each score's
    mean with `<score>_lo`, `<score>_hi` (a t-interval over the samples at `level`), the GEMM's
    share of the flops, and `family` 1: each interval at `level` on its own (no Bonferroni)."""
    meta = {s.layer: s for s in sites}
    rows = []
    for (layer, gemm), g in samples.groupby(["layer", "gemm"], sort=False):
        row = {"layer": layer, "gemm": gemm, "depth": meta[layer].depth}
        row["flops"] = meta[layer].flops
        row["samples"] = len(g)
        for score in SCORES:
            ci = t_interval(g[score].to_numpy(np.float64), level)
            row |= {score: ci.estimate, f"{score}_lo": ci.lo, f"{score}_hi": ci.hi}
        for whole in dict.fromkeys(TOTALS.values()):
            if whole in g:
                row[whole] = float(g[whole].astype(np.float64).mean())
        rows.append(row)
    table = pd.DataFrame(rows)
    table["flop_share"] = table["flops"] / table["flops"].sum()
    table["family"] = 1
    return table


def agreement(table: pd.DataFrame, scores=SCORES) -> pd.DataFrame:
    """Spearman rank correlation of the scores' means across the rows of `summarize`'s table
    (score x score; NaN where a score is constant)."""
    return table[list(scores)].astype(np.float64).corr(method="spearman")


def rank(table: pd.DataFrame, score: str) -> pd.DataFrame:
    """`table` sorted by `score`, most sensitive first (ties: shallower layer first, then
    Fprop, Dgrad, Wgrad), with a 1-based `rank` column."""
    if score not in SCORES:
        raise ValueError(f"score {score!r}; allowed: {', '.join(SCORES)}")
    order = table.drop(columns="rank", errors="ignore").assign(_g=table["gemm"].map(GEMMS.index))
    order = order.sort_values([score, "depth", "_g"], ascending=[False, True, True], kind="stable")
    order = order.drop(columns="_g").reset_index(drop=True)
    order.insert(0, "rank", np.arange(1, len(order) + 1))
    return order


def tied_at_top(ranked: pd.DataFrame, score: str) -> int | None:
    """How many of `rank`'s first entries cannot be told from the first: the last position
    whose interval's upper end reaches the first's lower end (1: the first stands apart).
    None when the first has no interval (fewer than 3 samples)."""
    lo = ranked[f"{score}_lo"].iloc[0]
    if not np.isfinite(lo):
        return None
    reach = np.flatnonzero(ranked[f"{score}_hi"].to_numpy(np.float64) >= lo)
    return int(reach.max()) + 1 if reach.size else 1


def kept_gates(sites, chosen) -> np.ndarray:
    """Gate rows (2, 3 * sites) of the all-FP4 model and of the model with the set `chosen`
    [(layer, gemm)] kept in high precision (their gates 0), the rest quantized."""
    index = {
        (site.layer, g): 3 * i + j for i, site in enumerate(sites) for j, g in enumerate(GEMMS)
    }
    rows = np.ones((2, 3 * len(sites)), np.float32)
    rows[1, [index[tuple(c)] for c in chosen]] = 0
    return rows


def kept_share(measured, score: str, *, level: float = 0.95):
    """The share of the all-FP4 model's `score` measure that keeping the set removes, measured
    (not added up from single GEMMs): mean_s (m_fp4 - m_set) / mean_s m_fp4 over the samples
    of `measured` (`stage1.replay` of `kept_gates`), with Fieller's interval of the ratio of
    paired means. (estimate, lo, hi, samples); None for a score that is not a share of a
    step's loss decrease (`TOTALS`)."""
    if score not in TOTALS:
        return None
    name = "step_loss" if score.endswith("step_loss") else "update_loss"
    whole, kept = [], []
    for out, shadow in measured:
        m = np.asarray(out[name], np.float64)[:2]
        if name == "step_loss":
            with np.errstate(invalid="ignore", divide="ignore"):
                m = (m - shadow["step"]) / -shadow["step"]
        whole.append(m[0])
        kept.append(m[1])
    whole, kept = np.asarray(whole), np.asarray(kept)
    gain = whole - kept
    with np.errstate(invalid="ignore", divide="ignore"):
        estimate = float(gain.mean() / whole.mean())
    lo, hi = fieller_interval(gain, whole, level)
    return estimate, float(lo), float(hi), len(whole)
