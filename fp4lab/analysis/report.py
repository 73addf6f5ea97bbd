"""One self-contained HTML page of a sweep's results: tables, verdicts, figures.

`write_report(results, path)` reads only the store's tables (`results.runs`,
`results.metrics`) and writes a single file that opens offline: styles inline, every figure a
base64 PNG in an <img> tag, no scripts, fonts or links to fetch. Its sections:

    Runs          what was run: experiments, cells, seeds, failures
    Cells         per cell: divergence rate (Wilson), loss gap (seeds as random effects),
                  tokens to target (BCa bootstrap), overhead against the baseline recipe
    What matters  `analysis.verdict` (cells against the seed streams) for the loss gap (and
                  divergence, when some runs diverged)
    Tables        the experiment's own tables: every `<name>.csv` at the top of the results
                  folder (what the experiment file's `analyze(results)` wrote), read as data
    Figures       `plots.iter_figures`, the same set `plots.standard_figures` writes
    Methods       how every interval was made
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import numpy as np
import pandas as pd

from fp4lab.analysis import frames, plots, tables, verdicts

__all__ = ["cell_table", "render", "write_report"]

_CSS = """
body { font: 15px/1.5 system-ui, sans-serif; max-width: 1150px; margin: 2em auto; padding: 0 1em;
       color: #1a1a1a; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #ddd; text-align: left; }
th { background: #f3f3f3; }
td.matters { font-weight: bold; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
.note { color: #555; }
"""

_METHODS = [
    "Only runs with status “ok” give outcomes; failed runs are counted in every table.",
    "Divergence rate: diverged / n with a Wilson score interval.",
    "Loss gap: final loss − the task's exact optimum, mean over seeds; runs with a non-finite "
    "loss are counted, not averaged; seeds are random effects: a t-interval over seed triples "
    "(i, i, i), a generalized interval over each stream's levels when the streams are crossed; "
    "no interval below 3 levels.",
    "Tokens to target: median over seeds, a run that never reaches the target counts as "
    "infinitely many tokens (so “never” when more than half never reach); overhead = ratio to "
    "the baseline − 1, the cell and its baseline resampled independently; BCa bootstrap "
    "(percentile where some runs never reach).",
    "What matters: cells as fixed effects (each pair, paired on the seeds they share), seed "
    "streams as crossed random effects (the SD each induces, its interactions included), "
    "generalized confidence intervals from the mean squares; Bonferroni over all rows; "
    "“too few seeds” below 3 levels of a stream.",
]


def _ci(est, lo, hi, fmt: str = "{:.3g}") -> str:
    """'est [lo, hi]' with inf as 'never' / '∞' and NaN as '–'."""

    def one(x):
        if np.isnan(x):
            return "–"
        if np.isinf(x):
            return "∞"
        return f"{x:,.0f}" if abs(x) >= 1000 and fmt == "{:.3g}" else fmt.format(x)

    if np.isposinf(est):
        return "never"
    if np.isnan(lo) and np.isnan(hi):
        return one(est)
    return f"{one(est)} [{one(lo)}, {one(hi)}]"


def cell_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per cell, formatted for reading: n, failed, diverged, loss gap, tokens, overhead."""
    rate = tables.divergence_rate(runs)
    out = rate[["cell", "n", "failed"]].copy()
    out["diverged"] = [
        f"{d}/{n} · " + _ci(r, lo, hi, "{:.0%}")
        for d, n, r, lo, hi in rate[["diverged", "n", "rate", "rate_lo", "rate_hi"]].itertuples(
            index=False
        )
    ]
    ok = runs[runs["status"] == "ok"]
    outcome = "loss_gap" if np.isfinite(ok["loss_gap"].astype(np.float64)).any() else "final_loss"
    gap = tables.loss_gap(runs, outcome=outcome)
    out[outcome.replace("_", " ")] = [
        _ci(g, lo, hi) for g, lo, hi in gap[["gap", "gap_lo", "gap_hi"]].itertuples(index=False)
    ]
    if np.isfinite(ok["target_loss"].astype(np.float64)).any():
        base, match = tables.default_baseline(ok)
        tok = tables.tokens_to_target(runs, baseline=base, match=match)
        out["tokens to target"] = [
            _ci(t, lo, hi) + (f" ({k} never)" if k else "")
            for t, lo, hi, k in tok[["tokens", "tokens_lo", "tokens_hi", "never"]].itertuples(
                index=False
            )
        ]
        if base is not None:
            cols = ["overhead", "overhead_lo", "overhead_hi"]
            out[f"overhead vs {base['recipe']}"] = [
                "baseline" if b else _ci(o, lo, hi, "{:+.1%}")
                for o, lo, hi, b in tok[[*cols, "baseline"]].itertuples(index=False)
            ]
    return out


def _verdict_html(runs: pd.DataFrame, outcome: str) -> str:
    table = verdicts.verdict(runs, outcome)
    if not len(table):
        return "<p class='note'>No cell or seed stream varies in this sweep.</p>"
    shown = pd.DataFrame(
        {
            "factor": table["factor"],
            "kind": table["kind"],
            "term": table["term"],
            "verdict": table["verdict"],
            "effect (difference, or SD a stream induces)": [
                _ci(e, lo, hi)
                for e, lo, hi in table[["effect", "lo", "hi"]].itertuples(index=False)
            ],
            "share of seed variance": [
                _ci(s, lo, hi, "{:.1%}")
                for s, lo, hi in table[["share", "share_lo", "share_hi"]].itertuples(index=False)
            ],
            "in seed SDs": [_ci(x, np.nan, np.nan, "{:.2g}") for x in table["in_seed_sd"]],
            "levels": table["levels"],
        }
    )
    a = table.attrs
    note = (
        f"{a['comparisons']} comparisons; {a['correction']} intervals at "
        f"{a['row_level']:.4f} each, {a['level']:.0%} together; seeds as crossed random effects."
    )
    body = shown.to_html(index=False, border=0)
    for word in ("matters", "higher", "lower"):
        body = body.replace(f"<td>{word}</td>", f"<td class='matters'>{word}</td>")
    return f"<p class='note'>{html.escape(note)}</p>\n{body}"


def _figure_html(name: str, fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=plots.DPI)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    caption = html.escape(name.replace("_", " "))
    return (
        f"<figure><img alt='{html.escape(name)}' src='data:image/png;base64,{data}'>"
        f"<figcaption>{caption}</figcaption></figure>"
    )


def _tables_html(folder) -> list[str]:
    """The experiment's own tables: the CSV files at the top of the results folder."""
    files = sorted(Path(folder).glob("*.csv")) if folder is not None else []
    if not files:
        return []
    parts = ["<h2>Tables</h2>"]
    for path in files:
        table = pd.read_csv(path)
        parts += [f"<h3>{html.escape(path.name)}</h3>", table.to_html(index=False, border=0)]
    return parts


def render(results) -> str:
    """The report page as an HTML string (see the module docstring for its sections)."""
    runs, metrics = results.runs, results.metrics
    experiments = ", ".join(str(e) for e in pd.unique(runs["experiment"])) if len(runs) else "–"
    title = f"fp4lab results: {experiments}"
    ok = runs[runs["status"] == "ok"] if len(runs) else runs
    seeds = [c for c in frames.SEEDS if c in runs.columns]
    n_triples = len(runs[seeds].drop_duplicates()) if seeds and len(runs) else 0
    parts = [
        f"<h1>{html.escape(title)}</h1>",
        "<h2>Runs</h2>",
        f"<p>{len(runs)} runs in {runs['cell'].nunique() if len(runs) else 0} cells, "
        f"{n_triples} distinct seed triples; {len(runs) - len(ok)} failed. "
        f"{metrics['metric'].nunique()} metrics logged.</p>",
    ]
    if len(runs):
        parts += ["<h2>Cells</h2>", cell_table(runs).to_html(index=False, border=0)]
        outcome = "loss_gap" if np.isfinite(ok["loss_gap"].astype(np.float64)).any() else None
        parts += ["<h2>What matters</h2>"]
        parts += [
            f"<h3>{outcome or 'final_loss'}</h3>",
            _verdict_html(runs, outcome or "final_loss"),
        ]
        if ok["diverged"].astype(bool).any():
            parts += ["<h3>diverged (0/1)</h3>", _verdict_html(runs, "diverged")]
    parts += _tables_html(getattr(results, "path", None))
    parts.append("<h2>Figures</h2>")
    parts += [_figure_html(name, fig) for name, fig in plots.iter_figures(results)]
    parts.append("<h2>Methods</h2><ul>")
    parts += [f"<li>{html.escape(m)}</li>" for m in _METHODS]
    parts.append("</ul>")
    body = "\n".join(parts)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )


def write_report(results, path) -> Path:
    """Writes the report of a results object as one self-contained HTML file.

    Args:
      results: anything with the store's `runs` and `metrics` DataFrames.
      path: the HTML file to write, or a folder (e.g. the results folder itself), in which case
        the file is `<path>/report.html`. Written atomically (a temporary file, then rename).
    Returns:
      The path of the HTML file.
    """
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        path = path / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render(results), encoding="utf-8")
    tmp.replace(path)
    return path
