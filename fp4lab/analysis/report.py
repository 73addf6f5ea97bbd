"""One self-contained HTML page of a sweep's results: tables, verdicts, figures.

`write_report(results, path)` reads only what the store's `load` gives (`results.runs`,
`results.metrics`, and where present `experiment`, `provenance`, `config_fields` and the
folder's tables) and writes a single file that opens offline: styles inline, every figure a
base64 PNG in an <img> tag, no scripts, fonts or links to fetch. Its sections:

    Runs          what was run: experiments, cells, seeds, failures
    Cells         per cell: divergence rate (exact), loss gap (seeds as random effects),
                  tokens to target (order statistics), overhead against the baseline recipe
    What matters  `analysis.verdict` (cells against the seed streams) for the loss gap (and
                  divergence, when some runs diverged)
    Tables        the experiment's own tables: every `<name>.csv` at the top of the results
                  folder (what the experiment file's `analyze(results)` wrote), read as data
                  and formatted (`format_table`: numbers rounded, `x`, `x_lo`, `x_hi` columns
                  as one "x [lo, hi]" column)
    Figures       `plots.iter_figures`, the same set `plots.standard_figures` writes
    Config and    the experiment (name, file, the overrides it ran with for every cell), the
    provenance    config every cell shares, per cell its seeds and the fields it changes, and
                  the code that made the runs (`results.provenance`: fp4lab version and git
                  revision, numerics version, jax, jaxlib, flax, python, device, when the
                  sweep that made them started)
    Methods       how every interval was made

Everything but `runs` and `metrics` is optional: a results object without the others gets
the parts it has (config columns then are the columns that are no identity, seed or summary).
"""

from __future__ import annotations

import base64
import html
import io
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from fp4lab.analysis import frames, plots, tables, verdicts
from fp4lab.analysis.columns import require, require_tables

__all__ = ["cell_table", "format_table", "render", "write_report"]

_CSS = """
body { font: 15px/1.5 system-ui, sans-serif; max-width: 1150px; margin: 2em auto; padding: 0 1em;
       color: #1a1a1a; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #ddd; text-align: left; }
th { background: #f3f3f3; }
td.matters { font-weight: bold; }
table.config td:nth-child(odd) { color: #555; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
.note { color: #555; }
"""

_METHODS = [
    "Only runs with status “ok” give outcomes; failed runs are counted in every table.",
    "Divergence rate: diverged / n with an exact (Clopper-Pearson) interval.",
    "Loss gap: final loss − the task's exact optimum, mean over seeds; runs with a non-finite "
    "loss are counted, not averaged; seeds are random effects: a t-interval over seed triples "
    "(i, i, i), a generalized interval over each stream's levels when the streams are crossed; "
    "no interval below 3 levels.",
    "Tokens to target: median over seeds, a run that never reaches the target counts as "
    "infinitely many tokens (so “never” when more than half never reach), its interval from "
    "order statistics; overhead = ratio of the geometric means of the cell's and the "
    "baseline's runs − 1, with Welch's t-interval on the logs (none where some runs never "
    "reach).",
    "What matters: cells as fixed effects (each pair, paired on the seeds they share), seed "
    "streams as crossed random effects: a stream's own SD (its main effect and two-way "
    "interactions, judged by an exact F-test) beside its re-draw SD (own + the term all "
    "streams share); generalized confidence intervals from the mean squares; Bonferroni over "
    "all rows; “undecided” where an end is within 3 Monte Carlo errors of 0 or the test and "
    "the interval disagree; “too few seeds” below 3 levels of a stream.",
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


CELL_TABLE = ("run_id", "cell", "status", "diverged", "divergence_kind", "divergence_step")
CELL_TABLE += ("loss_gap", "final_loss", "loss_floor", "target_loss", "tokens_to_target")


def summary_outcome(runs: pd.DataFrame) -> str:
    """The outcome the summary judges: "loss_gap" where some ok run has one (the task's optimum
    is known), else "final_loss"."""
    ok = runs[runs["status"] == "ok"]
    return "loss_gap" if np.isfinite(ok["loss_gap"].astype(np.float64)).any() else "final_loss"


def cell_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per cell, formatted for reading: n, failed, diverged, loss gap, tokens, overhead."""
    require(runs, CELL_TABLE, "cell_table")
    rate = tables.divergence_rate(runs)
    out = rate[["cell", "n", "failed"]].copy()
    out["diverged"] = [
        f"{d}/{n} · " + _ci(r, lo, hi, "{:.0%}")
        for d, n, r, lo, hi in rate[["diverged", "n", "rate", "rate_lo", "rate_hi"]].itertuples(
            index=False
        )
    ]
    ok = runs[runs["status"] == "ok"]
    outcome = summary_outcome(runs)
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
    # the rows `fp4lab show` and `run`'s summary print: every cell against one baseline, so a
    # contrast has the same Bonferroni family, and interval, in all three
    base = verdicts.baseline_cell(runs) if runs["cell"].nunique() > 1 else None
    table = verdicts.verdict(runs, outcome, baseline=base)
    if not len(table):
        return "<p class='note'>No cell or seed stream varies in this sweep.</p>"
    shown = pd.DataFrame(
        {
            "factor": table["factor"],
            "kind": table["kind"],
            "term": table["term"],
            "verdict": table["verdict"],
            "effect (difference, or a stream's own SD)": [
                _ci(e, lo, hi)
                for e, lo, hi in table[["effect", "lo", "hi"]].itertuples(index=False)
            ],
            "re-draw SD": [
                _ci(e, lo, hi)
                for e, lo, hi in table[["redraw_sd", "redraw_lo", "redraw_hi"]].itertuples(
                    index=False
                )
            ],
            "own share of seed variance": [
                _ci(s, lo, hi, "{:.1%}")
                for s, lo, hi in table[["share", "share_lo", "share_hi"]].itertuples(index=False)
            ],
            "in seed SDs": [_ci(x, np.nan, np.nan, "{:.2g}") for x in table["in_seed_sd"]],
            "levels": table["levels"],
        }
    )
    a = table.attrs
    against = f"every cell against {base}; " if base is not None else ""
    note = (
        f"{against}{a['comparisons']} comparisons (the family `fp4lab show` uses); "
        f"{a['correction']} intervals at {a['row_level']:.4f} each, {a['level']:.0%} together; "
        "seeds as crossed random effects."
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


def _number(x) -> str:
    """A number for reading: 4 significant digits, whole numbers from 1,000 on with their
    thousands grouped, NaN as '–', infinities as '∞' and '−∞'."""
    if isinstance(x, bool | np.bool_):
        return str(bool(x))
    x = float(x)
    if np.isnan(x):
        return "–"
    if np.isinf(x):
        return "∞" if x > 0 else "−∞"
    if x == 0:
        return "0"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def _interval(est, lo, hi) -> str:
    """'est [lo, hi]', or 'est' alone where both bounds are missing."""
    if pd.isna(lo) and pd.isna(hi):
        return _number(est)
    return f"{_number(est)} [{_number(lo)}, {_number(hi)}]"


def _is_number(column: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)


def format_table(table: pd.DataFrame) -> pd.DataFrame:
    """A table for reading, every value a string.

    A numeric column `x` that comes with numeric `x_lo` and `x_hi` columns becomes one column
    "x [lo, hi]" of "est [lo, hi]" (the estimate alone where both bounds are missing); other
    numbers get 4 significant digits (whole numbers from 1,000 on, thousands grouped), NaN
    shows as '–' in numeric columns and as an empty cell in text columns; text is kept.
    """
    columns = list(table.columns)
    merged = {
        c
        for c in columns
        if f"{c}_lo" in columns
        and f"{c}_hi" in columns
        and all(_is_number(table[k]) for k in (c, f"{c}_lo", f"{c}_hi"))
    }
    bounds = {f"{c}_{end}" for c in merged for end in ("lo", "hi")}
    out = {}
    for c in columns:
        if c in bounds:
            continue
        if c in merged:
            values = zip(table[c], table[f"{c}_lo"], table[f"{c}_hi"], strict=True)
            out[f"{c} [lo, hi]"] = [_interval(e, lo, hi) for e, lo, hi in values]
        elif _is_number(table[c]) or pd.api.types.is_bool_dtype(table[c]):
            out[c] = [_number(v) for v in table[c]]
        else:
            out[c] = ["" if pd.isna(v) else str(v) for v in table[c]]
    return pd.DataFrame(out, index=table.index, dtype=object)


def _tables_html(folder) -> list[str]:
    """The experiment's own tables: the CSV files at the top of the results folder."""
    files = sorted(Path(folder).glob("*.csv")) if folder is not None else []
    if not files:
        return []
    parts = ["<h2>Tables</h2>"]
    for path in files:
        table = format_table(pd.read_csv(path))
        parts += [f"<h3>{html.escape(path.name)}</h3>", table.to_html(index=False, border=0)]
    return parts


def _config_value(value) -> str:
    """A config value as the experiment file would write it (floats short, None as None)."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "None"
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, float | np.floating):
        return f"{float(value):g}"
    if isinstance(value, str):
        return value if value else '""'
    return str(value)


def _seeds_text(runs: pd.DataFrame) -> str:
    """The seed triples of some runs, short: '0–3 in every stream', else each stream's seeds."""
    seeds = [c for c in frames.SEEDS if c in runs.columns]
    if not seeds:
        return "–"
    triples = sorted({tuple(int(v) for v in t) for t in runs[seeds].itertuples(index=False)})
    n = len(triples)
    if len(seeds) == 3 and triples == [(i, i, i) for i in range(n)]:
        return f"{n}: {'0' if n == 1 else f'0–{n - 1}'} in every stream"
    streams = []
    for column in seeds:
        values = sorted({int(v) for v in runs[column]})
        streams.append(f"{column.removeprefix('seed_')} {', '.join(map(str, values))}")
    return f"{n} triples: " + "; ".join(streams)


def _config_fields(results) -> list[str]:
    """The config columns of the runs table: the store's `config_fields`, else every column
    that is neither identity, seed nor summary. A field the summary also writes (the resolved
    target_loss) is left out: its column holds the summary's value."""
    runs = results.runs
    known = {*frames.IDENTITY, *frames.SEEDS, *frames.SUMMARIES}
    fields = getattr(results, "config_fields", None) or [c for c in runs.columns if c not in known]
    return [f for f in fields if f in runs.columns and f not in frames.SUMMARIES]


def _provenance_table(results) -> pd.DataFrame | None:
    """One row per distinct code and environment: how many runs it made, and when."""
    prov = getattr(results, "provenance", None)
    if prov is None or prov.empty:
        return None
    keys = [
        c
        for c in ("code", "numerics", "jax", "jaxlib", "flax", "python", "backend", "device", "cpu")
        if c in prov.columns
    ]
    prov = prov.assign(**{k: prov[k].map(_config_value) for k in keys})
    rows = []
    for values, group in prov.groupby(keys, sort=False, dropna=False):
        row = {"runs": len(group)} | dict(zip(keys, values, strict=True))
        if "time_utc" in group.columns and group["time_utc"].notna().any():
            times = sorted(group["time_utc"].dropna())
            row["sweep started (UTC)"] = (
                times[0] if times[0] == times[-1] else f"{times[0]} – {times[-1]}"
            )
        rows.append(row)
    return pd.DataFrame(rows)


def _config_html(results) -> list[str]:
    """The experiment, the config every cell shares, what each cell changes, and the code."""
    runs = results.runs
    manifest = getattr(results, "experiment", None) or {}
    parts = ["<h2>Config and provenance</h2>"]
    if manifest:
        name, file = manifest.get("name", "?"), manifest.get("file", "?")
        parts.append(
            f"<p>Experiment <b>{html.escape(str(name))}</b> from <code>{html.escape(str(file))}"
            f"</code>, {len(manifest.get('cells', []))} cells.</p>"
        )
        overrides = manifest.get("overrides") or {}
        if overrides:
            text = ", ".join(f"{k}={_config_value(v)}" for k, v in overrides.items())
            parts.append(
                "<p>Set for every cell when it ran (<code>fp4lab run --set</code>, "
                f"<code>--steps</code>): <code>{html.escape(text)}</code></p>"
            )
    fields = _config_fields(results)
    cells = list(pd.unique(runs["cell"]))
    varying = [f for f in fields if runs[f].map(_config_value).nunique() > 1]
    shared = [f for f in fields if f not in varying]
    per_cell = []
    for cell in cells:
        group = runs[runs["cell"] == cell]
        row = {"cell": cell, "runs": len(group), "seeds": _seeds_text(group)}
        for f in varying:
            row[f] = " | ".join(dict.fromkeys(group[f].map(_config_value)))
        per_cell.append(row)
    parts += [
        "<h3>Per cell</h3>",
        "<p class='note'>Seeds (init, data, quant) and the config fields that differ between "
        "cells.</p>",
        pd.DataFrame(per_cell).to_html(index=False, border=0),
    ]
    if shared:
        pairs = [(f, _config_value(runs[f].iloc[0])) for f in shared]
        width = 3  # field/value pairs per table row
        rows = [pairs[i : i + width] for i in range(0, len(pairs), width)]
        body = "".join(
            "<tr>"
            + "".join(f"<td>{html.escape(k)}</td><td>{html.escape(v)}</td>" for k, v in row)
            + "</tr>"
            for row in rows
        )
        parts += [
            "<h3>Shared config</h3>",
            f"<p class='note'>The {len(shared)} config fields every cell has in common.</p>",
            f"<table class='config'>{body}</table>",
        ]
    table = _provenance_table(results)
    parts.append("<h3>Provenance</h3>")
    if table is None:
        parts.append("<p class='note'>No provenance recorded.</p>")
    else:
        if len(table) > 1:
            parts.append(
                f"<p class='note'>These runs come from {len(table)} different code versions "
                "or environments.</p>"
            )
        parts.append(table.to_html(index=False, border=0))
    return parts


def render(results) -> str:
    """The report page as an HTML string (see the module docstring for its sections)."""
    runs, metrics = results.runs, results.metrics
    if len(runs):
        require_tables("render", metrics=metrics, runs=runs, needs=("experiment", *CELL_TABLE))
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
    if len(runs):
        parts += _config_html(results)
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
        the file is `<path>/report.html`. Written atomically (a temporary file, fsync, rename,
        fsync of the folder); on a failure (a full disk) the temporary file is removed.
    Returns:
      The path of the HTML file.
    """
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        path = path / "report.html"
    text = render(results).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, Ctrl-C: no temporary file left behind
        Path(tmp).unlink(missing_ok=True)
        raise
    if hasattr(os, "O_DIRECTORY"):  # the rename reaches the disk (POSIX)
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    return path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
