"""A results folder as TensorBoard event files, one folder per run.

    fp4lab export --tensorboard results/quickstart        # -> results/quickstart/tensorboard
    tensorboard --logdir results/quickstart/tensorboard

A run (a cell x a seed triple) gets the folder `<cell in words>/init<i>_data<d>_quant<q>`
("NVFP4, Wgrad in BF16/init0_data1_quant0", `labels.cell_label`), and every row of its metrics
is a scalar at its step, tagged by the metric's name: the series (loss, grad_norm, loss_scale,
eval_loss) and the telemetry (quant/..., grad/..., acc/..., depth/...), which TensorBoard groups
by the prefix. Values are TensorBoard's 32-bit floats; NaN and inf stay as they are.

An export replaces the event files an earlier export wrote into a run's folder, so exporting
again after more runs finish does not double the points. Needs tensorboardX
(`pip install "fp4lab[tensorboard]"`); fp4lab imports without it.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pandas as pd

from fp4lab.analysis.columns import require, require_tables
from fp4lab.analysis.labels import cell_label
from fp4lab.schema import SEED_COLUMNS, STREAMS

__all__ = ["INSTALL", "TensorBoardNotInstalled", "run_folders", "tensorboard"]

INSTALL = 'pip install "fp4lab[tensorboard]"'


class TensorBoardNotInstalled(ModuleNotFoundError):
    """The TensorBoard export was asked for, but tensorboardX cannot be imported here."""


def _summary_writer():
    """tensorboardX's SummaryWriter; TensorBoardNotInstalled, with the install command, without
    it."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError as e:
        raise TensorBoardNotInstalled(
            f"the TensorBoard export needs tensorboardX, which is not installed: {INSTALL}"
        ) from e
    return SummaryWriter


@contextlib.contextmanager
def _nan_is_data() -> Iterator[None]:
    """tensorboardX logs a warning for every NaN or inf it writes; here they are data (a
    diverged run's loss, the gradient-to-noise ratio of a layer without noise)."""
    log = logging.getLogger("tensorboardX.x2num")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _folder_name(text: str) -> str:
    """`text` as one folder name on any system: path separators and the characters Windows
    forbids become "_"; never empty, "." or ".."."""
    name = re.sub(r'[\x00-\x1f/\\<>:"|?*]', "_", text).strip(" .")
    return name or "_"


def run_folders(runs: pd.DataFrame, labels: Mapping[str, str] | None = None) -> dict[str, str]:
    """{run_id: its folder under the log dir, "<cell in words>/init<i>_data<d>_quant<q>"}.

    Args:
      runs: the runs table (run_id, cell and the seed columns).
      labels: {cell name: readable name} overriding `labels.cell_label`.
    Returns:
      One distinct folder per run, in the table's order; where two runs would share one (two
      cells with the same name in words), the second gets its run id appended.
    """
    require(runs, ("run_id", "cell", *SEED_COLUMNS), "run_folders")
    folders: dict[str, str] = {}
    taken: set[str] = set()
    for row in runs.to_dict("records"):
        seeds = "_".join(f"{s}{int(row[c])}" for s, c in zip(STREAMS, SEED_COLUMNS, strict=True))
        folder = f"{_folder_name(cell_label(row['cell'], labels))}/{seeds}"
        if folder in taken:
            folder = f"{folder}_{row['run_id']}"
        taken.add(folder)
        folders[row["run_id"]] = folder
    return folders


def tensorboard(results, logdir, *, labels: Mapping[str, str] | None = None) -> list[Path]:
    """Writes every run's metrics as TensorBoard scalars (see the module docstring).

    Args:
      results: anything with the store's `runs` and `metrics` DataFrames (`fl.load(folder)`).
      logdir: the folder to write into (created if missing): `tensorboard --logdir` it.
      labels: {cell name: readable name} for the run folders (default `labels.cell_label`).
    Returns:
      The run folders written, in the runs table's order; a run without metrics (one that
      failed before its first step) gets none.
    Raises:
      TensorBoardNotInstalled: tensorboardX cannot be imported here.
    """
    require_tables("tensorboard", metrics=results.metrics, runs=results.runs, needs=("run_id",))
    summary_writer = _summary_writer()
    logdir = Path(logdir)
    metrics = results.metrics.sort_values(["run_id", "step", "metric"], kind="stable")
    per_run = dict(tuple(metrics.groupby("run_id", sort=False)))
    written = []
    for run_id, folder in run_folders(results.runs, labels).items():
        rows = per_run.get(run_id)
        if rows is None:
            continue
        path = logdir / folder
        path.mkdir(parents=True, exist_ok=True)
        for earlier in path.glob("events.out.tfevents.*"):
            earlier.unlink()  # this run's earlier export: replaced, not added to
        scalars = zip(rows["metric"], rows["value"], rows["step"], strict=True)
        writer = summary_writer(str(path), max_queue=len(rows) + 1, flush_secs=3600)
        try:
            with _nan_is_data():
                for metric, value, step in scalars:
                    writer.add_scalar(metric, float(value), int(step))
        finally:
            writer.close()
        written.append(path)
    return written
