"""Instability outcomes: how often runs spike or diverge, what sets it off, what comes before.

The per-run outcomes are the runs table's spike columns (`fp4lab.train.spikes`: spikes,
first_spike, max_spike, diverged_at_end) and `diverged` (`fp4lab.train.divergence`):

    spike_rates        per cell: runs with a spike event, runs that end in one, runs that
                       diverged, each a share with its exact (Clopper-Pearson) interval
    rate_contrast      two cells' shares against each other: Fisher's exact test, a word
    lr_sensitivity     Wortsman et al. 2023's LR sensitivity per recipe
    stream_attribution is an outcome tied to the quant stream or to init and data? the
                       quant seed's flips (exact) and a permutation test
    predictive         per-step signals before an event: AUC and lead time, runs as the unit
    signal_growth      per cell: a signal at the start and at its peak before any event
                       (these two and parse_events live in `fp4lab.analysis.precursors`)
    fork_outcomes      forks taken k steps before an event: averted, delayed or not

Every word here comes from an exact procedure: Clopper-Pearson intervals (coverage at least
the level at every rate), Fisher's exact test and permutation tests (size at most alpha under
their null); tests/analysis/test_instability.py checks coverage and size by simulation at the
designs the studies run. Seeds are the unit of every interval: a run is one draw.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from fp4lab.analysis.frames import ok_runs, require
from fp4lab.analysis.intervals import exact_binomial_interval, t_interval
from fp4lab.analysis.precursors import parse_events, predictive, signal_growth

__all__ = [
    "OUTCOMES",
    "spike_rates",
    "rate_contrast",
    "contrasts",
    "lr_sensitivity",
    "stream_attribution",
    "predictive",
    "signal_growth",
    "fork_outcomes",
    "parse_events",
]

# binary outcomes of a run: a spike event at all, ending inside one, the in-run divergence rule
OUTCOMES = {
    "spiked": lambda r: r["spikes"].astype(float) > 0,
    "diverged_at_end": lambda r: r["diverged_at_end"].astype(bool),
    "diverged": lambda r: r["diverged"].astype(bool),
}
NAN = float("nan")


def _outcome(runs: pd.DataFrame, outcome: str) -> pd.Series:
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {outcome!r}; allowed: {', '.join(OUTCOMES)}")
    return OUTCOMES[outcome](runs).astype(bool)


def spike_rates(runs: pd.DataFrame, by: Sequence[str] = ("cell",), *, level: float = 0.95):
    """Per group: n runs, how many spiked (a spike event), ended in one (diverged_at_end) or
    diverged (the in-run rule), each share with its Clopper-Pearson interval; the events in
    all, the median first-spike step and the largest spike.

    Returns:
      DataFrame: the `by` columns, n, spiked, spiked_rate, spiked_lo, spiked_hi, and the same
      for diverged_at_end and diverged, events, median_first_spike, max_spike.
    """
    need = ("status", "spikes", "first_spike", "max_spike", "diverged_at_end", "diverged")
    require(runs, (*by, *need), "spike_rates")
    rows = []
    for key, g in runs.groupby(list(by), sort=False, dropna=False):
        ok = ok_runs(g)
        row = dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True))
        row["n"] = len(ok)
        for name in OUTCOMES:
            k = int(_outcome(ok, name).sum())
            ci = exact_binomial_interval(k, len(ok), level)
            row |= {name: k, f"{name}_rate": ci.estimate, f"{name}_lo": ci.lo, f"{name}_hi": ci.hi}
        row["events"] = int(ok["spikes"].fillna(0).sum())
        row["median_first_spike"] = float(ok["first_spike"].median())
        row["max_spike"] = float(ok["max_spike"].max())
        rows.append(row)
    return pd.DataFrame(rows)


def rate_contrast(
    runs: pd.DataFrame,
    a: str,
    b: str,
    *,
    outcome: str = "spiked",
    by: str = "cell",
    level: float = 0.95,
    family: int = 1,
) -> dict:
    """Does cell `a` spike (or diverge) more often than cell `b`? Fisher's exact test.

        p = two-sided Fisher exact p-value of the 2 x 2 table (a, b) x (event, none)

    verdict: "higher" / "lower" (a's share against b's) when p < (1 - level) / family
    (Bonferroni over `family` contrasts), else "no evidence". Fisher's test conditions on the
    margins: its size is at most alpha (tested by simulation at 8 vs 8 runs). Each cell's
    share carries its own Clopper-Pearson interval at `level`; `disjoint` says whether the
    two do not overlap.
    """
    require(runs, (by, "status"), "rate_contrast")
    counts = []
    for cell in (a, b):
        ok = ok_runs(runs[runs[by] == cell])
        if not len(ok):
            raise ValueError(f"rate_contrast: no finished runs in {by}={cell!r}")
        counts.append((int(_outcome(ok, outcome).sum()), len(ok)))
    (ka, na), (kb, nb) = counts
    p = float(scipy_stats.fisher_exact([[ka, na - ka], [kb, nb - kb]]).pvalue)
    ia, ib = exact_binomial_interval(ka, na, level), exact_binomial_interval(kb, nb, level)
    alpha = (1 - level) / family
    word = "no evidence" if p >= alpha else ("higher" if ka / na > kb / nb else "lower")
    return {
        "contrast": f"{a} vs {b}",
        "a": a,
        "b": b,
        "outcome": outcome,
        "k_a": ka,
        "n_a": na,
        "k_b": kb,
        "n_b": nb,
        "rate_a": ia.estimate,
        "lo_a": ia.lo,
        "hi_a": ia.hi,
        "rate_b": ib.estimate,
        "lo_b": ib.lo,
        "hi_b": ib.hi,
        "p": p,
        "family": family,
        "verdict": word,
        "disjoint": bool(ia.lo > ib.hi or ib.lo > ia.hi),
    }


def contrasts(
    runs: pd.DataFrame,
    pairs: Sequence[tuple[str, str]],
    *,
    outcome: str = "spiked",
    by: str = "cell",
    level: float = 0.95,
) -> pd.DataFrame:
    """`rate_contrast` of each (a, b) in `pairs`, Bonferroni over all of them: one row each."""
    rows = [
        rate_contrast(runs, a, b, outcome=outcome, by=by, level=level, family=len(pairs))
        for a, b in pairs
    ]
    return pd.DataFrame(rows)


def lr_sensitivity(
    runs: pd.DataFrame,
    *,
    by: str = "recipe",
    lr: str = "lr",
    loss: str = "final_loss",
    cap: str = "initial_loss",
    level: float = 0.95,
) -> pd.DataFrame:
    """Wortsman et al. 2023's LR sensitivity per group, and the loss at each learning rate.

        l(eta) = mean over seeds of min(final loss, cap)    (a diverged run counts as the cap)
        LR sensitivity = mean over the swept eta of l(eta) - min over eta of l(eta)

    the cap being the run's initial loss (a non-finite loss is the cap too). The learning
    rates should be log-spaced, as the paper's. Each l(eta) gets a t-interval over its seeds;
    the sensitivity is a point estimate (no interval: it is a max over noisy means).

    Returns:
      (table, per_lr): one row per group (by, sensitivity, best_lr, best_loss, lrs), and one
      per (group, lr) with the capped mean loss and its interval.
    """
    require(runs, (by, lr, loss, cap, "status"), "lr_sensitivity")
    ok = ok_runs(runs).copy()
    capped = ok[loss].astype(float).where(np.isfinite(ok[loss].astype(float)), ok[cap])
    ok["capped"] = np.minimum(capped, ok[cap].astype(float))
    per_lr, table = [], []
    for group, g in ok.groupby(by, sort=False):
        means = {}
        for eta, h in g.groupby(lr, sort=True):
            ci = t_interval(h["capped"].to_numpy(), level)
            means[float(eta)] = ci.estimate
            per_lr.append(
                {
                    by: group,
                    lr: float(eta),
                    "loss": ci.estimate,
                    "lo": ci.lo,
                    "hi": ci.hi,
                    "n": len(h),
                }
            )
        values = np.array(list(means.values()))
        best = min(means, key=means.get)
        table.append(
            {
                by: group,
                "sensitivity": float(values.mean() - values.min()),
                "best_lr": best,
                "best_loss": means[best],
                "lrs": len(means),
            }
        )
    return pd.DataFrame(table), pd.DataFrame(per_lr)


def stream_attribution(
    runs: pd.DataFrame,
    *,
    outcome: str = "spiked",
    by: str = "cell",
    censor: float | None = None,
    level: float = 0.95,
    permutations: int = 20_000,
    seed: int = 0,
) -> pd.DataFrame:
    """Is an instability outcome tied to the quant stream, or to init and data?

    The design: pairs of (init, data) seeds, each run under several quant seeds. The outcome
    is binary (`OUTCOMES`: "spiked", ...) or the time to the first spike ("first_spike", runs
    without one counted at `censor`, the run's length). Per cell:

      flips      pairs whose quant seeds disagree on the outcome. With init, data and the
                 recipe the same, only the quant stream differs, and a run is deterministic:
                 one flip is proof that the quant seed alone changes the outcome there
                 (exact; a recipe that draws nothing can have none)
      within     the mean |difference| of the outcome between two runs of the same pair (for
                 a binary outcome: the share that disagree), against
      between    the same between runs of different pairs
      ratio      within / between: about 1 when a fresh quant seed changes the outcome as
                 much as a fresh run; 0 when init and data alone fix it
      p          permutation test of "the pair does not matter" (outcomes exchangeable across
                 pairs): the share of permutations of the runs over pairs whose within-pair
                 difference is at most the observed one. Exact size (tested by simulation).
      verdict    "matters" (init and data fix part of it) when p < 1 - level; else
                 "no evidence" (a quant re-draw changes it as a fresh run would, within what
                 the seeds can tell)
      quant      "decides" when flips > 0; "draws nothing" when every pair's runs are
                 bit-identical (the same final loss); else "no flip seen"

    Returns one row per cell: pairs, quant_levels, events, flips, within, between, ratio, p,
    verdict, quant.
    """
    need = (by, "status", "seed_init", "seed_data", "seed_quant", "final_loss")
    require(runs, need, "stream_attribution")
    rng = np.random.default_rng(seed)
    rows = []
    for cell, g in ok_runs(runs).groupby(by, sort=False):
        if outcome == "first_spike":
            if censor is None:
                raise ValueError("stream_attribution: outcome 'first_spike' needs censor=steps")
            y = g["first_spike"].astype(float).fillna(float(censor)).to_numpy()
            events = int(g["first_spike"].notna().sum())
        else:
            y = _outcome(g, outcome).to_numpy().astype(float)
            events = int(y.sum())
        pair = g.groupby(["seed_init", "seed_data"], sort=True).ngroup().to_numpy()
        sizes = np.bincount(pair)
        if len(sizes) < 2 or sizes.min() < 2:
            rows.append(
                {
                    by: cell,
                    "pairs": len(sizes),
                    "verdict": "no design: needs 2 or more "
                    "(init, data) pairs with 2 or more quant seeds each",
                }
            )
            continue
        flips = sum(len(set(y[pair == i])) > 1 for i in range(len(sizes)))
        within = _within(y, pair, len(sizes))
        between = _between(y, pair)
        perm = np.array(
            [_within(rng.permutation(y), pair, len(sizes)) for _ in range(permutations)]
        )
        p = float((np.sum(perm <= within * (1 + 1e-12)) + 1) / (permutations + 1))
        same = all(g[pair == i]["final_loss"].nunique(dropna=False) == 1 for i in range(len(sizes)))
        quant = "decides" if flips else ("draws nothing" if same else "no flip seen")
        rows.append(
            {
                by: cell,
                "outcome": outcome,
                "pairs": len(sizes),
                "quant_levels": int(np.median(sizes)),
                "events": events,
                "flips": int(flips),
                "within": within,
                "between": between,
                "ratio": within / between if between > 0 else NAN,
                "p": p,
                "verdict": "matters" if p < 1 - level else "no evidence",
                "quant": quant,
            }
        )
    return pd.DataFrame(rows)


def _within(y: np.ndarray, pair: np.ndarray, n_pairs: int) -> float:
    """Mean |y_a - y_b| over the runs a != b of the same (init, data) pair, pairs averaged."""
    shares = []
    for i in range(n_pairs):
        v = y[pair == i]
        d = np.abs(v[:, None] - v[None, :])
        shares.append(d.sum() / (len(v) * (len(v) - 1)))
    return float(np.mean(shares))


def _between(y: np.ndarray, pair: np.ndarray) -> float:
    """Mean |y_a - y_b| over runs of different (init, data) pairs."""
    d = np.abs(y[:, None] - y[None, :])
    other = pair[:, None] != pair[None, :]
    return float(d[other].mean())


def fork_outcomes(
    forks: pd.DataFrame, *, by: Sequence[str] = ("change",), level: float = 0.95
) -> pd.DataFrame:
    """The share of events each in-situ change averts or delays, with exact intervals.

    `forks` holds one row per fork: its change, the parent's first event step (`event`), the
    fork's first spike at or after the fork's step (`fork_first`, NaN: none) and the delay
    that counts (`delay`, in steps). A fork averts the event when it has none to the end of the
    run; delays it when its first comes more than `delay` steps (the row's) after the
    parent's; else the event happens. Clopper-Pearson intervals over the forked events.
    """
    require(forks, (*by, "event", "fork_first", "delay"), "fork_outcomes")
    rows = []
    for key, g in forks.groupby(list(by), sort=False):
        averted = g["fork_first"].isna()
        delayed = ~averted & (g["fork_first"] > g["event"] + g["delay"])
        n = len(g)
        a = exact_binomial_interval(int(averted.sum()), n, level)
        ad = exact_binomial_interval(int((averted | delayed).sum()), n, level)
        row = dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True))
        rows.append(
            row
            | {
                "events": n,
                "averted": int(averted.sum()),
                "averted_rate": a.estimate,
                "averted_lo": a.lo,
                "averted_hi": a.hi,
                "delayed": int(delayed.sum()),
                "averted_or_delayed_rate": ad.estimate,
                "averted_or_delayed_lo": ad.lo,
                "averted_or_delayed_hi": ad.hi,
            }
        )
    return pd.DataFrame(rows)
