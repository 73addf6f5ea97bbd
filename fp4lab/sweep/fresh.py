"""A finished study's cells again on fresh seeds, and which of its words survive them.

    replicate("results/mxfp4_ladder_lm", seeds_from=8)

re-runs every cell of the folder's experiment with every seed moved up by `seeds_from` (a cell
of seed triples (i, i, i), i = 0..7, runs (8+i, 8+i, 8+i); a crossed cell keeps its design on
new levels of each stream) into its own results folder, `<folder>_fresh<N>` by default, with
the runner and store a sweep uses: finished runs are skipped, a killed replication resumes
where it stopped, any executor computes it. Seeds that any stream of the committed runs has
already used are refused: a replication on seeds the study saw is no replication. Then the
experiment file's `analyze(results)` runs on the fresh runs and on the committed and fresh runs
pooled (a Results whose path is the committed folder, so that an `analyze` that reads a
file beside the runs, such as a thinned study's saved outcomes, reads the committed one; a
stream a cell holds at one seed in both is one level pooled: `one_level_kept`), and
`analysis.replication.compare_words` reads every worded row against the committed
table (the folder's CSV where it has one, else `analyze` of the committed runs).

Writes into the fresh folder: the fresh tables (`<name>.csv`, as `fp4lab run` does),
`pooled/<name>.csv`, and `words.csv` (table, row, committed, fresh, pooled, replication).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from fp4lab.analysis.replication import compare_words
from fp4lab.schema import STREAMS
from fp4lab.sweep.experiment import (
    Experiment,
    ExperimentError,
    analyzed,
    load_experiment,
    seed_triples,
)
from fp4lab.sweep.runner import run_experiment
from fp4lab.sweep.store import Results, load

__all__ = ["experiment_file", "fresh_experiment", "one_level_kept", "replicate"]


def fresh_experiment(experiment: Experiment, used: dict[str, set], seeds_from: int) -> Experiment:
    """`experiment` with every seed of every cell moved up by `seeds_from`.

    Raises:
      ExperimentError: a moved seed of some stream is one the committed runs used (`used`:
        {stream: seeds}); the message names the stream and the first free start.
    """
    if isinstance(seeds_from, bool) or not isinstance(seeds_from, int) or seeds_from < 1:
        raise ExperimentError(f"seeds_from={seeds_from!r}; must be an int >= 1")
    cells = []
    for cell in experiment.cells:
        triples = seed_triples([tuple(s + seeds_from for s in t) for t in cell.seeds])
        for i, stream in enumerate(STREAMS):
            taken = sorted({t[i] for t in triples} & used.get(stream, set()))
            if taken:
                free = max(max(s) for s in used.values() if s) + 1
                raise ExperimentError(
                    f"seeds_from={seeds_from}: cell {cell.label!r} would rerun {stream} seeds "
                    f"{taken[:5]} that the committed runs used; fresh seeds start at {free} "
                    f"or later"
                )
        cells.append(dataclasses.replace(cell, seeds=triples))
    return dataclasses.replace(experiment, cells=tuple(cells))


def one_level_kept(committed: pd.DataFrame, fresh: pd.DataFrame) -> pd.DataFrame:
    """`fresh` runs with each stream that a cell holds at one seed, in the committed runs and
    in the fresh ones, given the committed seed: such a stream is a constant of the cell (BF16
    draws nothing from the quant stream, whose seed moved from 0 to N only to clear the used
    seeds), one level pooled as it is in each half, not a two-level factor confounded with the
    halves (which would leave the pooled contrasts "too few seeds"). A cell that does draw
    from such a stream keeps that draw's effect in its residual, as each half does."""
    out = fresh.copy()
    for cell, rows in fresh.groupby("cell", sort=False):
        before = committed[committed["cell"] == cell]
        for s in STREAMS:
            col = f"seed_{s}"
            if before[col].nunique() == 1 and rows[col].nunique() == 1:
                out.loc[rows.index, col] = before[col].iloc[0]
    return out


def experiment_file(folder: Path, manifest: dict) -> Path:
    """The experiment file a results folder's manifest records, from any working folder: its
    path from the results folder (`from_folder`), else its recorded path (relative to the
    working folder of the study's first run) from the working folder or from a folder above
    the results folder."""
    if "from_folder" in manifest and (folder / manifest["from_folder"]).is_file():
        return (folder / manifest["from_folder"]).resolve()
    recorded = Path(manifest.get("path", ""))
    if not manifest.get("path") or recorded.is_absolute() or recorded.is_file():
        return recorded
    above = (p / recorded for p in folder.resolve().parents)
    return next((p for p in above if p.is_file()), recorded)


def _same_runs(exp: Experiment, committed: Results, folder: Path, path: Path) -> None:
    """Refuses a file that asks for other runs than the committed ones: runs the folder lacks,
    or fewer runs (a cell deleted, fewer seeds) that would replicate a subset without a word."""
    asked = {r for c in exp.cells for r in c.run_ids()}
    held = set(committed.runs["run_id"])
    if not asked <= held:
        raise ExperimentError(
            f"{path} asks for runs that {folder} does not hold (the file changed, or the study "
            "ran with other --seeds): finish or rerun the study first"
        )
    if left := held - asked:
        cells = sorted(set(committed.runs.loc[committed.runs["run_id"].isin(left), "cell"]))
        raise ExperimentError(
            f"{path} no longer asks for {len(left)} of the {len(held)} committed runs (cells "
            f"{', '.join(cells)}): a replication of a subset; restore the file's cells and seeds"
        )


def _check_out(out: Path, folder: Path, fresh: Experiment) -> None:
    """Refuses a fresh folder that is the study or inside it, or one that holds the results of
    anything but this replication (another experiment, another study of this file, other
    seeds); a folder of this replication resumes."""
    full = out.resolve()
    if full == folder or folder in full.parents:
        where = "the study's own folder" + (" or inside it" if full != folder else "")
        raise ExperimentError(
            f"--out {out}: {where}; the fresh runs need a folder of their own (default: "
            "<study>_fresh<N>)"
        )
    try:
        held = json.loads((full / "experiment.json").read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError):
        held = {}
    ids = [c.get("run_ids") for c in held.get("cells", [])] if isinstance(held, dict) else []
    if ids != [list(c.run_ids()) for c in fresh.cells]:
        raise ExperimentError(
            f"--out {out} holds other results ({held.get('name', '?') if ids else 'unreadable'}"
            f"), not this replication's; choose another --out"
        )


def replicate(
    folder: str | Path,
    seeds_from: int,
    *,
    experiment: str | Path | None = None,
    out: str | Path | None = None,
    executor: str = "local",
    workers: int = 1,
    progress: bool = True,
    compute=None,
    **executor_options,
) -> pd.DataFrame:
    """Re-runs a finished study on fresh seeds and compares its words (module docstring).

    Args:
      folder: the committed results folder (experiment.json and its runs).
      seeds_from: how far every seed moves up; must clear every seed the study used.
      experiment: the experiment file (default: the path its manifest records).
      out: the fresh results folder (default `<folder>_fresh<seeds_from>`).
      executor, workers, progress, compute, executor_options: as `run_experiment`'s.
    Returns:
      The words table (also written to `<out>/words.csv`).
    Raises:
      ExperimentError: no experiment file, the file no longer asks for the committed runs, a
        file without analyze(results), or seeds that overlap the committed ones.
    """
    folder = Path(folder).resolve()  # "." has no name to derive the fresh folder's from
    if not (folder / "experiment.json").is_file():
        raise ExperimentError(f"{folder}: not a results folder (no experiment.json)")
    committed = load(folder)
    if committed.experiment is None:  # there, but unreadable (load warned what is wrong)
        raise ExperimentError(
            f"{folder}: its experiment.json cannot be read, so neither the study's cells nor its "
            "experiment file are known; restore it (or run the experiment file into the folder "
            "again: finished runs are kept)"
        )
    manifest = committed.experiment
    path = experiment_file(folder, manifest) if experiment is None else Path(experiment)
    if not path.is_file():
        raise ExperimentError(
            f"{folder}: its experiment file {path} is not there; give --experiment FILE"
        )
    exp = load_experiment(path, overrides=manifest.get("overrides"))
    if exp.analyze is None:
        raise ExperimentError(f"{path}: no analyze(results): no tables whose words to compare")
    _same_runs(exp, committed, folder, path)
    used = {s: set(committed.runs[f"seed_{s}"].astype(int)) for s in STREAMS}
    fresh_exp = fresh_experiment(exp, used, seeds_from)
    out = Path(out) if out is not None else folder.with_name(f"{folder.name}_fresh{seeds_from}")
    _check_out(out, folder, fresh_exp)
    counts = run_experiment(
        fresh_exp,
        out,
        executor=executor,
        workers=workers,
        progress=progress,
        compute=compute,
        **executor_options,
    )
    if counts["failed"]:
        raise ExperimentError(f"{out}: {counts['failed']} fresh run(s) failed; rerun to retry")
    fresh = load(out)
    # the pooled runs are the committed study's with the fresh ones added: files that analyze
    # reads beside the runs (a thinned study's saved telemetry outcomes) are the committed ones
    pooled = Results(
        folder,
        pd.concat([committed.runs, one_level_kept(committed.runs, fresh.runs)], ignore_index=True),
        pd.concat([committed.metrics, fresh.metrics], ignore_index=True),
        manifest,
    )
    tables = {"fresh": analyzed(exp, fresh, "fresh"), "pooled": analyzed(exp, pooled, "pooled")}
    (out / "pooled").mkdir(exist_ok=True)
    for name in tables["fresh"]:
        tables["fresh"][name].to_csv(out / f"{name}.csv", index=False, float_format="%.5g")
        tables["pooled"][name].to_csv(
            out / "pooled" / f"{name}.csv", index=False, float_format="%.5g"
        )
    on_file = {n: folder / f"{n}.csv" for n in tables["fresh"]}
    if all(p.is_file() for p in on_file.values()):
        before = {n: pd.read_csv(p) for n, p in on_file.items()}
    else:
        before = analyzed(exp, committed, "committed")
    words = compare_words(before, tables["fresh"], tables["pooled"])
    words.to_csv(out / "words.csv", index=False)
    return words
