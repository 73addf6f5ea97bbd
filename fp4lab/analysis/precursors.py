"""What comes before an instability event: the per-step signals read against a run's events.

    predictive         which signal rises before an event: AUC and lead time, runs the unit
    signal_growth      per cell: a signal at step 0 and at its peak before any event (does the
                       attention logit grow at a high lr; does qk-layernorm bound it?)
    parse_events       a run's `spike_events` text as (step, size, length) triples

Re-exported by `fp4lab.analysis.instability`, whose outcomes (the spike columns) they read.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from fp4lab.analysis.frames import ok_runs, require
from fp4lab.analysis.intervals import median_interval, t_interval

__all__ = ["predictive", "signal_growth", "parse_events"]

NAN = float("nan")


def predictive(
    metrics: pd.DataFrame,
    runs: pd.DataFrame,
    signals: Sequence[str],
    *,
    horizon: int = 50,
    window: int = 20,
    factor: float = 2.0,
    level: float = 0.95,
) -> pd.DataFrame:
    """Which per-step signal rises before a spike event? AUC and lead time, runs the unit.

    For each run with an event and each signal, a step t outside events is positive when an
    event starts in (t, t + horizon]; its score is the signal at t over the median of its
    last `window` values (a rise relative to its own recent level). AUC: the probability
    that a positive step outscores a negative one of the same run (Mann-Whitney), then a
    t-interval over runs. Lead time of an event: the steps before it since the signal last
    stayed above `factor` times its median over the `window` steps before the horizon (0: no
    rise; at most `horizon`); median and its order-statistic interval over events. Runs
    without an event give no positive step and are left out.

    Args:
      metrics: tidy rows (run_id, step, metric, value) with the loss and the signals.
      runs: the runs table (spike columns via `fp4lab.train.spikes` read from the loss).
      signals: metric names to score (e.g. "grad_norm", "update_ratio", "norm_max", "loss").
    Returns:
      One row per signal: runs, events, auc, auc_lo, auc_hi, lead_median, lead_lo, lead_hi.
    """
    require(runs, ("run_id", "spike_events"), "predictive")
    require(metrics, ("run_id", "step", "metric", "value"), "predictive")
    wide = metrics[metrics["metric"].isin(["loss", *signals])].pivot_table(
        index=["run_id", "step"], columns="metric", values="value"
    )
    rows = []
    for signal in signals:
        aucs, leads, n_events = [], [], 0
        for rid, text in zip(runs["run_id"], runs["spike_events"], strict=True):
            found = [(step, length) for step, _, length in parse_events(text)]
            if not found or rid not in wide.index.get_level_values(0):
                continue
            w = wide.loc[rid].sort_index()
            if signal not in w:
                continue
            n_events += len(found)
            score = _relative(w[signal].to_numpy(), window)
            positive, inside = _labels(len(w), found, horizon)
            keep = ~inside & np.isfinite(score)
            pos, neg = score[keep & positive], score[keep & ~positive]
            if len(pos) and len(neg):
                u = scipy_stats.mannwhitneyu(pos, neg).statistic
                aucs.append(u / (len(pos) * len(neg)))
            raw = w[signal].to_numpy()
            for start, _ in found:
                base = np.nanmedian(raw[max(start - horizon - window, 0) : max(start - horizon, 1)])
                above = raw[max(start - horizon, 0) : start] > factor * base
                lead = 0
                while lead < len(above) and above[len(above) - 1 - lead]:
                    lead += 1
                leads.append(lead)
        auc = t_interval(np.array(aucs), level)
        lead = median_interval(np.array(leads, float), level)
        rows.append(
            {
                "signal": signal,
                "runs": len(aucs),
                "events": n_events,
                "auc": auc.estimate,
                "auc_lo": auc.lo,
                "auc_hi": auc.hi,
                "lead_median": lead.estimate,
                "lead_lo": lead.lo,
                "lead_hi": lead.hi,
                "horizon": horizon,
            }
        )
    return pd.DataFrame(rows)


def signal_growth(
    metrics: pd.DataFrame,
    runs: pd.DataFrame,
    signals: Sequence[str],
    *,
    by: Sequence[str] = ("cell",),
    level: float = 0.95,
) -> pd.DataFrame:
    """Per group and signal: the signal at step 0 and its peak over the steps before the run's
    first spike event (all steps where it has none), each a mean over runs with a t-interval,
    and the peak's ratio to the start (a geometric mean: the mean of the log ratios, its
    interval exponentiated; none where a start or a peak is not above 0, e.g. the update
    ratio at step 0 of a warm-up from lr 0). Non-finite values are left out of the peak; a
    run whose signal is not finite at step 0, or that has no step before its first event, is
    left out (counted in `left_out`).

    Returns:
      One row per (group, signal): the `by` columns, signal, runs, left_out, start, start_lo,
      start_hi, peak, peak_lo, peak_hi, growth, growth_lo, growth_hi.
    """
    require(runs, (*by, "run_id", "first_spike"), "signal_growth")
    require(metrics, ("run_id", "step", "metric", "value"), "signal_growth")
    rows = []
    for key, g in ok_runs(runs).groupby(list(by), sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        for signal in signals:
            m = metrics[(metrics["metric"] == signal) & metrics["run_id"].isin(g["run_id"])]
            first = dict(zip(g["run_id"], g["first_spike"], strict=True))
            starts, peaks, left_out = [], [], 0
            for rid, series in m.groupby("run_id"):
                series = series.sort_values("step")
                stop = first[rid] if np.isfinite(first[rid]) else np.inf
                before = series[series["step"] < stop]["value"].to_numpy(float)
                before = before[np.isfinite(before)]
                start = series["value"].iloc[0]
                if series["step"].iloc[0] != 0 or not np.isfinite(start) or len(before) == 0:
                    left_out += 1
                    continue
                starts.append(float(start))
                peaks.append(float(before.max()))
            row = dict(zip(by, key, strict=True)) | {"signal": signal, "runs": len(starts)}
            row["left_out"] = left_out + len(g) - m["run_id"].nunique()
            if not starts:
                rows.append(row)
                continue
            for name, values in (("start", starts), ("peak", peaks)):
                ci = t_interval(np.asarray(values), level)
                row |= {name: ci.estimate, f"{name}_lo": ci.lo, f"{name}_hi": ci.hi}
            starts_a, peaks_a = np.asarray(starts), np.asarray(peaks)
            if np.all(starts_a > 0) and np.all(peaks_a > 0):  # else no ratio (e.g. a 0 start)
                ci = t_interval(np.log(peaks_a / starts_a), level)
                row |= {"growth": np.exp(ci.estimate)}
                row |= {"growth_lo": np.exp(ci.lo), "growth_hi": np.exp(ci.hi)}
            rows.append(row)
    return pd.DataFrame(rows)


def parse_events(text) -> list[tuple[int, float, int]]:
    """A run's spike_events column (`fp4lab.train.spikes.format_events`) as
    [(step, size, length)]; empty or NaN: no event."""
    if not isinstance(text, str) or not text:
        return []
    out = []
    for item in text.split(";"):
        step, size, length = item.split(":")
        out.append((int(step), float(size), int(length)))
    return out


def _relative(x: np.ndarray, window: int) -> np.ndarray:
    """x_t over the median of x_{t-window..t-1} (NaN until `window` values exist)."""
    out = np.full(len(x), NAN)
    for t in range(window, len(x)):
        ref = np.nanmedian(x[t - window : t])
        out[t] = x[t] / ref if ref > 0 else NAN
    return out


def _labels(n: int, found, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """(positive, inside) per step: an event starts within `horizon` after it; in an event."""
    positive, inside = np.zeros(n, bool), np.zeros(n, bool)
    for start, length in found:
        positive[max(start - horizon, 0) : start] = True
        inside[start : start + max(length, 1)] = True
    return positive, inside
