"""What a `Diagnosis` says in words: the summary paragraph `fp4lab diagnose` prints last.

Stage 1: the samples (and when the time budget cut them, which streams they cover; when too
few give no interval), the ranking and whether it is decided (`decided`; `scores.tied_at_top`:
"the first k cannot be told apart", with the samples that would part them; a first apart by
less than `MARGIN` times the second: "no GEMM stands out"), low agreement between the scores
(only where the ranking is not decided), the recommended set, what the budget or the rule of
`choose.worth` left out, and, only where the ranking is decided, the set's predicted share
(the set measured at stage 1, `scores.kept_share`) and the cheapest set whose GEMMs' scores
added reach the target share of the gap. Stage 2, its first words on whether the FP4 gap is
resolved at all, then the shares closed on both losses (and whether they disagree), random-k's
draws and their spread, last-blocks at its own share, and the verdicts; a cell it has no set
for is said in words.
"""

from __future__ import annotations

import numpy as np

from fp4lab.diagnosis import choose, scores
from fp4lab.schema import GEMMS

__all__ = ["summary", "decided", "MARGIN", "LOW_AGREEMENT", "DISAGREE"]

# the first is "apart" only at MARGIN times the second or more: on the planted models the
# culprit scores 6-24x the next GEMM, on the model without a plant the first 2.8x (27 samples)
MARGIN = 2.0
LOW_AGREEMENT = 0.5  # a median Spearman correlation with the other scores below this: "disagree"
DISAGREE = 3.0  # gaps on the two losses further apart than this factor (or of opposite sign)
_RANKED = ("alone_update_loss", "alone_grad_rel", "removed_update_loss", "removed_grad_rel")


def _name(layer: str, gemm: str) -> str:
    """ "blocks.0.mlp.up Wgrad"; a model that is itself the layer (its path "") is "the model"."""
    return f"{layer or 'the model'} {gemm.capitalize()}"


def _pct(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{100 * x:.0f} %"


def _interval(lo: float, hi: float) -> str:
    return "no interval" if not (np.isfinite(lo) and np.isfinite(hi)) else f"[{lo:.3g}, {hi:.3g}]"


def summary(d) -> str:
    """The paragraph(s) of a `Diagnosis` (module docstring)."""
    text = _stage1(d)
    if d.gap is not None:
        text += "\n\n" + _stage2(d)
    return text


def _hp(d) -> str:
    return d.hp if isinstance(d.hp, str) else getattr(d.hp, "name", "high precision")


def decided(d) -> bool:
    """Whether stage 1's ranking is decided: the first's interval clear of every other's and
    its mean at least `MARGIN` times the second's."""
    t, s = d.table, d.score
    tied = scores.tied_at_top(t, s)
    return tied == 1 and (len(t) < 2 or t[s].iloc[0] >= MARGIN * max(t[s].iloc[1], 0.0))


def _samples_needed(t, s) -> int | None:
    """Samples per GEMM at which the first and the second's intervals would part if their
    means and spreads held (half-widths shrink as 1/sqrt(n)); None where the means are equal."""
    n = int(t["samples"].iloc[0])
    first, second = t.iloc[0], t.iloc[1]
    apart = first[s] - second[s]
    widths = (first[s] - first[s + "_lo"]) + (second[s + "_hi"] - second[s])
    if not (apart > 0 and np.isfinite(widths)):
        return None
    return int(np.ceil(n * (widths / apart) ** 2)) + 1


def _streams(d) -> str:
    """Which held-out batches, quant seeds and checkpoints the samples cover, in words, when
    the time budget cut stage 1 (its intervals carry no variation of a stream held at one)."""
    words = {"checkpoint": "checkpoints", "batch": "held-out batches", "quant": "quant seeds"}
    cover = {w: sorted(set(d.samples[k])) for k, w in words.items() if k in d.samples}
    said = "; ".join(f"{w} {', '.join(map(str, v))}" for w, v in cover.items())
    fixed = [w for w, v in cover.items() if len(v) == 1]
    text = f"Its samples cover {said}"
    if fixed:
        text += f": its intervals carry no variation over {' or '.join(fixed)}"
    return text + "."


def _stage1(d) -> str:
    t, s = d.table, d.score
    n = int(t["samples"].iloc[0])
    first = t.iloc[0]
    parts = [
        f"Stage 1 ({n} samples per GEMM: checkpoints x batches x quant seeds; "
        f"{d.stage1_s:.0f} s, {d.compiles} compile(s) for {len(t) * 2 + 2} variants)."
    ]
    if d.planned and n < d.planned:
        parts.append(f"The time budget stopped it after {n} of {d.planned} samples.")
        parts.append(_streams(d))
    if d.excluded:
        parts.append(f"Left in high precision and out of the diagnosis: {', '.join(d.excluded)}.")
    tied = scores.tied_at_top(t, s)
    head = f"{_name(first['layer'], first['gemm'])} ({first[s]:.3g}, "
    head += _interval(first[s + "_lo"], first[s + "_hi"]) + ")"
    if tied is None:
        parts.append(
            f"With {n} sample(s) there is no interval (3 are needed), so the ranking is not "
            f"decided: ask for more samples (batches, quant seeds, checkpoints or a longer "
            f"time budget). Ranked by {s}, first {head}."
        )
    elif decided(d):
        parts.append(f"Ranked by {s}, first {head}, apart from the rest.")
    elif tied == 1:
        parts.append(
            f"The ranking by {s} is not decided: the first, {head}, stands apart but by less "
            f"than {MARGIN:g}x the second ({t[s].iloc[1]:.3g}): no GEMM stands out. More "
            "samples only narrow the intervals; what would decide it is a GEMM that stands "
            "out at later checkpoints (more steps), else FP4 hurts this model evenly."
        )
    else:
        names = ", ".join(_name(r.layer, r.gemm) for r in t.head(tied).itertuples())
        need = _samples_needed(t, s)
        more = (
            f" About {need} samples per GEMM (now {n}: more batches, quant seeds or "
            "checkpoints, or a longer time budget) would part the first two if their means "
            "held; if those stay close, no GEMM stands out."
            if need is not None
            else ""
        )
        parts.append(
            f"The ranking by {s} is not decided: the first {tied} cannot be told apart (their "
            f"intervals reach the first's): {names}. First {head}.{more}"
        )
    agree = d.agreement[s].drop(s).reindex([c for c in _RANKED if c != s]).dropna()
    if tied is not None and not decided(d) and len(agree) and agree.median() < LOW_AGREEMENT:
        parts.append(
            f"The scores disagree as well (Spearman with {s}: "
            + ", ".join(f"{k} {v:.2f}" for k, v in agree.items())
            + "): the other scores would order these GEMMs otherwise."
        )
    by_gemm = t.groupby("gemm")[s].mean().reindex(list(GEMMS))
    parts.append(
        "By GEMM the mean is " + ", ".join(f"{g.capitalize()} {v:.3g}" for g, v in by_gemm.items())
    )
    parts[-1] += "."
    parts.extend(_sets(d))
    return " ".join(parts)


def _sets(d) -> list[str]:
    t, hp = d.table, _hp(d)
    out = []
    if d.over_budget:
        out.append(f"Nothing is kept: {d.over_budget}.")
    elif not d.chosen:
        out.append(
            f"Nothing is kept: no GEMM's {d.score} is resolved above zero with a predicted "
            "share of the gap at its lower end at least its share of the FLOPs (the rule of "
            "`choose.worth`)."
        )
    else:
        names = ", ".join(_name(*c) for c in d.chosen)
        text = (
            f"Keeping {names} in {hp} costs {d.share:.1%} of GEMM FLOPs (budget {d.budget:.1%}, "
            "a ceiling)"
        )
        if decided(d) and d.predicted is not None:
            share, lo, hi, n = d.predicted
            text += (
                f", predicted to close {_pct(share)} [{_pct(lo)}, {_pct(hi)}] of the FP4 gap (the "
                f"set kept against all-FP4, measured on stage 1's {n} samples)."
            )
        elif decided(d):
            text += f", predicted to close {_pct(choose.predicted_share(t, d.chosen, d.score))} "
            text += "of the FP4 gap (its GEMMs' scores added)."
        else:
            text += ": no share of the gap is predicted while the ranking is not decided."
        out.append(text)
    budget = d.skipped[d.skipped["why"] == "budget"] if len(d.skipped) else d.skipped
    if len(budget):
        out.append(
            "Left out by the budget although worth keeping: "
            + "; ".join(
                f"{_name(row.layer, row.gemm)} (rank {row.rank}, {row.flop_share:.1%} of FLOPs; "
                f"keeping it as well costs {row.with_it:.1%})"
                for row in budget.itertuples()
            )
            + "."
        )
    cheap = d.skipped[d.skipped["why"] != "budget"] if len(d.skipped) else d.skipped
    if len(cheap):
        out.append(
            "Left out as not worth their FLOPs (resolved above zero, but the lower end of the "
            "predicted share is below the FLOP share): "
            + ", ".join(
                f"{_name(r.layer, r.gemm)} (rank {r.rank}, {r.flop_share:.1%} of FLOPs)"
                for r in cheap.head(3).itertuples()
            )
            + (f" and {len(cheap) - 3} more (skipped.csv)" if len(cheap) > 3 else "")
            + "."
        )
    unresolved = int(len(t) - len(d.chosen) - len(d.skipped))
    if unresolved and d.chosen:
        out.append(f"{unresolved} GEMMs whose {d.score} interval reaches zero are not kept.")
    if d.reaching and decided(d):
        share = choose.share(t, d.reaching)
        whole = choose.total(t, d.score)
        added = float(t[d.score].clip(lower=0).sum()) / whole if whole > 0 else float("nan")
        out.append(
            f"The cheapest set predicted to close {_pct(d.target)} of the gap by its GEMMs' "
            "scores added: "
            + ", ".join(_name(*c) for c in d.reaching)
            + f" ({share:.1%} of FLOPs; all single scores add up to {added:.2f}x the all-FP4 "
            "model's own, a measure of how far they are from additive)."
        )
    return out


def _stage2(d) -> str:
    g = d.gap.set_index("cell")
    hp = _hp(d)
    mean, lo, hi, pairs = d.gap_hp
    parts = []
    resolved = np.isfinite(lo) and (lo > 0 or hi < 0)
    if not resolved:
        parts.append(
            f"The FP4-to-{hp} gap on eval_hp is not resolved ({mean:.3g}, "
            f"{_interval(lo, hi)} over {pairs} paired seeds): no share of it below means much; "
            "train longer or on more seeds."
        )
    took = f"{d.verify_s:.0f} s"
    if d.trained_s > d.verify_s + 1:
        took += f" in this call; its runs took {d.trained_s:.0f} s, partly earlier"
    own, own_lo, own_hi, _ = d.gap_own_total
    parts.append(
        f"Stage 2 ({took}, {pairs} paired seeds): the FP4-to-{hp} gap is {mean:.3g} "
        f"{_interval(lo, hi)} on eval_hp (held out, high-precision forward) and {own:.3g} "
        f"{_interval(own_lo, own_hi)} on eval_loss (the runs' own forward)."
    )
    if _disagree(mean, own):
        parts.append(
            "The two losses disagree: "
            + (
                "FP4 hurts the trained weights more than the loss under its own forward shows."
                if abs(mean) > abs(own)
                else "most of the FP4 gap is the quantized forward's own error, not the weights'."
            )
        )
    if "top-k" not in d.sets:
        parts.append("The recommended set is empty: stage 2 measured the FP4 gap alone.")
        return " ".join(parts)
    cells = [c for c in ("top-k", "last-blocks") if c in d.sets]
    parts.append(
        "Share of the gap closed: "
        + "; ".join(f"{c} {_closed(g, c)} at {g.loc[c, 'flop_share']:.1%} of FLOPs" for c in cells)
        + "."
    )
    if "last-blocks" not in d.sets:
        parts.append("No whole layer fits top-k's FLOP share: no last-blocks cell.")
    draws = g[g.index.str.startswith("random-k:")]["gap_closed"]
    if len(draws):
        parts.append(
            f"random-k ({len(draws)} draws at {g.loc['random-k', 'flop_share']:.1%} on "
            f"average): their mean {_closed(g, 'random-k')}, the draws from "
            f"{_pct(draws.min())} to {_pct(draws.max())}."
        )
    else:
        parts.append(
            "No random set within top-k's FLOP share differs from top-k (at a budget that "
            "keeps every GEMM every draw is the whole model): the ranking has no random "
            "control, and nothing says it beats random."
        )
    v = d.versus.set_index("against")
    if "random-k" in v.index:
        beats = v.loc["random-k", "verdict"] == "lower"
        parts.append(
            ("The ranking beats random-k" if beats else "The ranking does not beat random-k")
            + f" (top-k - random-k eval_hp {v.loc['random-k', 'diff']:.3g}, "
            f"{_interval(v.loc['random-k', 'diff_lo'], v.loc['random-k', 'diff_hi'])}: "
            f"{v.loc['random-k', 'verdict']})."
        )
    if "last-blocks" in v.index:
        parts.append(f"Against last-blocks: {v.loc['last-blocks', 'verdict']}.")
    return " ".join(parts)


def _closed(g, cell: str) -> str:
    lo, hi = g.loc[cell, "lo"], g.loc[cell, "hi"]
    return f"{_pct(g.loc[cell, 'gap_closed'])} [{_pct(lo)}, {_pct(hi)}]"


def _disagree(a: float, b: float) -> bool:
    """Gaps of opposite sign, or further apart than `DISAGREE` times."""
    if not (np.isfinite(a) and np.isfinite(b)):
        return False
    if a * b <= 0:
        return a != b
    return max(abs(a), abs(b)) > DISAGREE * min(abs(a), abs(b))
