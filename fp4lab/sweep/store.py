"""Results on disk: one JSON file per finished run, keyed by run id, loadable as pandas.

Layout of a results folder (it belongs to one experiment):

    <out>/experiment.json        the sweep: name, source file, cells and their run ids
    <out>/runs/<run_id>.json     one run: config, seeds, data hashes, numerics version, status,
                                 summary, provenance, the name and sha256 of its metrics file,
                                 checksum
    <out>/runs/<run_id>.parquet  its per-step metrics, long: run_id, step, metric, value (the
                                 series loss, grad_norm, loss_scale and the telemetry)
    <out>/stream.jsonl           with `fp4lab run --stream`: steps as they are computed

Records written before the Parquet files (schema 1 and 2) hold the series and telemetry inside
the JSON; they are read as they are, and `load` gives the same tables for both layouts.

A run's id (`run_id`) hashes everything that decides its numbers: the resolved config, the three
seeds, the content hash of any data file it reads and of the user's code (`data_hashes`, with the
route of a process without the CPU kernels) and `NUMERICS_VERSION`, which the code bumps when a
change alters results on purpose. A rerun therefore skips exactly the runs whose numbers it would
reproduce, and recomputes the rest (an edited config or data file, a numerics change). Files
are written atomically (`fp4lab.sweep.records`); everything is JSON (no pickle): loading
someone else's results never runs their code.

Current and stale: the runs of `experiment.json`'s cells are current; any other record in `runs/`
(an earlier version of the file, other steps or seeds, another numerics version) is stale. `load`
returns the current runs, labelled by the manifest (a renamed cell shows its new name);
`load(path, stale=True)` the stale ones, each labelled with its config id so that runs of
different configs never pool. Nothing is deleted.

`load(path)` gives a `Results` with three DataFrames:

    runs        one row per run: run_id, experiment, cell, status, seed_init, seed_data,
                seed_quant, one column per config field, the summary numbers, wall_s
    metrics     long: run_id, step, metric, value (loss, grad_norm, loss_scale, eval_loss and
                the telemetry keys quant/<layer>/<gemm>/<operand>/<stat>, grad/<layer>/<stat>)
    provenance  one row per run: run_id, numerics, code (fp4lab version and git revision),
                jax, jaxlib, flax, device, cpu (the host's model and vector extensions; None
                in records made before it was kept), backend, python, time_utc (when the
                sweep that made it started)

and `config_fields`, the names of the config columns of `runs`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fp4lab.schema import RECORDED_BEFORE, SEED_COLUMNS, SIGNALS, STREAMS, did_you_mean
from fp4lab.sweep import compact, frames
from fp4lab.sweep import metrics as metrics_file
from fp4lab.sweep.cells import checked
from fp4lab.sweep.index import COLUMNS, Index, stamp_of
from fp4lab.sweep.provenance import code_version, cpu, host, numerics_route, package_versions
from fp4lab.sweep.records import (
    SCHEMA,
    CorruptRecord,
    StoreError,
    canonical,
    read_json,
    read_record,
    seal,
    warn_bad,
    write_atomic,
)
from fp4lab.train import own

__all__ = [
    "NUMERICS_VERSION",
    "SCHEMA",
    "CorruptRecord",
    "ID_DEFAULTS",
    "INERT",
    "Results",
    "Store",
    "StoreError",
    "code_version",
    "config_id",
    "cpu",
    "identity",
    "data_hashes",
    "label_runs",
    "load",
    "package_versions",
    "provenance",
    "run_id",
    "run_ids",
]

# Bump when a change to fp4lab alters the numbers of any run on purpose (a new rounding rule, a
# fixed bug in a quantizer, a different data sampler): every run id changes with it, so a rerun
# recomputes everything and the older records become stale instead of being reused.
NUMERICS_VERSION = 2  # 2: pass-through casts (bf16, fp16) no longer droppable by XLA
# Config fields added after results were first stored, with the value the records made before
# them were computed with (`fp4lab.schema.RECORDED_BEFORE`): left out of the run id at that
# value, so adding a field does not turn every stored run stale. A field whose Config default
# is that value changes nothing; one whose default differs (telemetry_stats) gives new runs
# new ids while experiment files that pin the old value keep theirs. A change to the numbers
# that no field chooses bumps NUMERICS_VERSION.
ID_DEFAULTS: dict[str, Any] = RECORDED_BEFORE
# Fields that decide nothing in some configs (the statistics' method of a run without
# telemetry): left out of the id there, and shown at their ID default.
INERT: dict[str, Callable[[dict[str, Any]], bool]] = {
    "telemetry_stats": lambda config: not config.get("telemetry_every"),
    "task_file": lambda config: True,  # a path: its content hash is in the data hashes
}
_DATA_FIELDS = {"text": "text_path"}
# `Store.frame`'s columns, and config_id: the index's but the code version and precedence
FRAME_COLUMNS = [c for c in map(str.strip, COLUMNS.split(",")) if c not in ("code", "rank")]
# what `load` with a filter (cells, seeds) reads of every run to label, check and filter them;
# the rest of the `FRAME_COLUMNS` only for the runs chosen (`Store.detailed`)
LABEL_COLUMNS = ["run_id", "experiment", "cell", "status", "config_key", *SEED_COLUMNS]
_FEW = 900  # at most this many runs read by id (SQLite's limit of bound values is 999 or more)
_NUMBERS = dict.fromkeys(SEED_COLUMNS + ("numerics", "has_file"), "int64") | {
    "wall_s": "float64"
}  # task -> the config field naming its data file


def data_hashes(config: dict[str, Any]) -> dict[str, str]:
    """{config field: sha256 of the file's bytes} for each data file the config reads, and
    the numerics route where this process computes without the CPU kernels
    (`fp4lab.sweep.provenance.numerics_route`).

    Raises:
      OSError: the file cannot be read (the experiment loader reports it with its cell).
    """
    route = numerics_route()  # computed without the CPU kernels: runs of their own
    if config.get("task") == "own":  # the file's source and the data files it declares
        return own.hashes(config["task_file"]) | route
    field = _DATA_FIELDS.get(config.get("task"))
    if not field or not config.get(field):
        return route
    return {field: hashlib.sha256(Path(config[field]).read_bytes()).hexdigest()} | route


def identity(config: dict[str, Any]) -> dict[str, Any]:
    """The fields of a resolved config that decide its numbers: all but the `ID_DEFAULTS`
    fields at their defaults and the `INERT` fields where they decide nothing."""
    return {
        k: v
        for k, v in config.items()
        if not (k in ID_DEFAULTS and v == ID_DEFAULTS[k]) and not (k in INERT and INERT[k](config))
    }


def config_id(config: dict[str, Any], data: dict[str, str] | None = None) -> str:
    """A 12-hex hash of what decides a run's numbers except its seeds: its config, data
    hashes and numerics version (runs of one cell share it)."""
    payload = {"config": identity(config), "data": data or {}, "numerics": NUMERICS_VERSION}
    return hashlib.sha256(canonical(payload).encode()).hexdigest()[:12]


def _payload(config: dict[str, Any], seeds, data: dict[str, str] | None) -> str:
    """The canonical text that a run id hashes (`run_id`)."""
    payload = {"config": identity(config), "seeds": [int(s) for s in seeds], "schema": 1}
    if data:
        payload["data"] = data
    if NUMERICS_VERSION != 1:  # version 1 left out: the ids of the first stored results stay
        payload["numerics"] = NUMERICS_VERSION
    return canonical(payload)


def run_id(
    config: dict[str, Any], seeds: tuple[int, int, int], data: dict[str, str] | None = None
) -> str:
    """The id of a run, 16 hex: sha256 of its resolved config's `identity` (less the
    `ID_DEFAULTS` fields at their defaults and the `INERT` ones), its seeds (init, data,
    quant), the content hashes of its data files (`data_hashes`) and `NUMERICS_VERSION`."""
    return hashlib.sha256(_payload(config, seeds, data).encode()).hexdigest()[:16]


def run_ids(
    config: dict[str, Any], seeds: Sequence[tuple[int, int, int]], data: dict | None = None
) -> list[str]:
    """`run_id` of each seed triple, the config's part of the hashed text built once: the
    seeds are the payload's last key, so each id hashes that text with its seeds appended."""
    head = _payload(config, (0, 0, 0), data)[: -len("[0,0,0]}")]
    return [
        hashlib.sha256(f"{head}[{int(a)},{int(b)},{int(c)}]}}".encode()).hexdigest()[:16]
        for a, b, c in seeds
    ]


def provenance() -> dict[str, Any]:
    """What made a run: package versions, git revision (and whether the tree had edits),
    numerics version, python, backend, device kind and host CPU (`cpu`), time."""
    prov = host()
    return {"versions": prov.pop("versions"), "numerics": NUMERICS_VERSION, **prov}


class Store:
    """A results folder: records by run id, atomic writes, bad entries skipped with a warning,
    and its summary index (`fp4lab.sweep.index`), brought up to date once per Store."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.runs_dir = self.path / "runs"
        if self.path.exists() and not self.path.is_dir():
            raise StoreError(f"{self.path} is a file; a results folder is a directory")
        self._index: Index | None = None
        self._config_cache: dict[str, tuple[dict, dict, str]] = {}

    def file(self, rid: str) -> Path:
        return self.runs_dir / f"{rid}.json"

    def index(self) -> Index:
        """The folder's index, up to date with its files when first asked for; each damaged
        compacted part is reported then, in one warning line (`Index.report_damaged`)."""
        if self._index is None:
            self._index = Index(self.path, config_id, code_version, NUMERICS_VERSION)
            self._index.refresh()
            self._index.report_damaged()
        return self._index

    def close(self) -> None:
        """Closes the index (its WAL is folded into the database file)."""
        if self._index is not None:
            self._index.close()
            self._index = None

    def refresh(self) -> None:
        """Reads into the index the files changed since it last did (`Index.refresh`)."""
        self.index().refresh()

    def damaged(self) -> dict[str, str]:
        """{run id: the damaged compacted part that spoils it} (`Index.damaged_runs`): such runs
        count as damaged (`fp4lab ls`), a rerun computes them again, their metrics are not
        read, and every reader names the part (`Index.report_damaged`)."""
        return self.index().damaged_runs()

    def statuses(self) -> dict[str, tuple[str, str]]:
        """{run id: (status, code version)} of every run of the folder, from the index; a run
        a damaged part spoils has status "damaged" (`damaged`)."""
        bad = self.damaged()
        rows = self.index().rows(columns="run_id, status, code")
        return {r: ("damaged" if r in bad else status, code) for r, status, code in rows}

    def read(self, rid: str, metrics: bool = True) -> dict[str, Any] | None:
        """The record of run `rid`, or None when it is absent or bad (bad: one warning). With
        `metrics`, its series and telemetry are filled in from its Parquet file or compacted
        part (if it has one), so the record reads as the run's full result in every layout; a
        run whose metrics a thinning compaction dropped (`compact.compact(keep_metrics=...)`)
        reads without series and telemetry."""
        rows = self.index().rows("run_id=?", (rid,))
        if not rows:
            return None
        source = rows[0][-2]
        if source == "runs":
            record = read_record(self.file(rid))
            table = metrics_file.table_of if record else None
        else:
            record = next(iter(compact.read_part(self.path, source, [rid])), None)

            def table(r, _):
                return compact.read_metrics(self.path, source, [rid])

        if not (metrics and record and record.get("metrics")) or rid in self.damaged():
            return record
        rows = table(record, self.runs_dir)
        if not rows.num_rows:  # dropped by a thinning compaction: `reproduce` regenerates them
            return record
        return metrics_file.series_of(record, rows)

    def finished(self, rid: str) -> bool:
        """Whether `rid` has a valid record with status "ok" (failed runs are retried)."""
        rows = self.index().rows("run_id=?", (rid,))
        return bool(rows) and rows[0][3] == "ok" and rid not in self.damaged()

    def write(self, record: dict[str, Any]) -> Path:
        """Writes one run record: its series and telemetry to `<run_id>.parquet`, then the rest
        as JSON with that file's name and sha256 (and the record's schema and checksum), then
        its row of the index. The files are written atomically, the Parquet file first: a kill
        between the two leaves no record, and the run is redone."""
        record = dict(record)
        series = record.pop("series", None) or {}
        telemetry = record.pop("telemetry", None) or {}
        rid = record["run_id"]
        data = None
        if series or telemetry:
            data = metrics_file.parquet_bytes(metrics_file.table(rid, series, telemetry))
            write_atomic(self.runs_dir / f"{rid}.parquet", data)
            record["metrics"] = {
                "file": f"{rid}.parquet",
                "sha256": hashlib.sha256(data).hexdigest(),
                "series": list(series),
            }
        body, text = seal(record)
        f = self.file(body["run_id"])
        write_atomic(f, text)
        body.pop("checksum")
        parquet = (self.runs_dir / f"{rid}.parquet").stat() if data is not None else None
        self.index().write(body, stamp_of(f.stat(), parquet))
        return f

    def write_experiment(self, manifest: dict[str, Any]) -> None:
        write_atomic(self.path / "experiment.json", json.dumps(manifest, indent=1))

    def experiment(self) -> dict[str, Any] | None:
        """The manifest, or None when absent or bad (bad: one warning naming what is wrong)."""
        f = self.path / "experiment.json"
        if not f.exists():
            return None
        body, why = read_json(f)
        if why is None and not (
            isinstance(body, dict)
            and isinstance(body.get("name"), str)
            and isinstance(body.get("cells"), list)
            and all(
                isinstance(c, dict) and isinstance(c.get("run_ids"), list) for c in body["cells"]
            )
        ):
            why = "not an experiment manifest (needs name and cells with run_ids)"
        if why is not None:
            warn_bad(f, f"bad experiment manifest, ignored: {why}")
            return None
        return body

    def records(self, metrics: bool = True) -> list[dict[str, Any]]:
        """Every valid run record, in files or compacted (bad entries skipped with one warning
        each), by run id; `metrics` as in `read`. Reads every record: `summaries` reads the
        index only."""
        out = []
        for row in self.index().rows():
            record = self.read(row[0], metrics)
            if record is not None:
                out.append(record)
        return out

    def summaries(self) -> list[dict[str, Any]]:
        """Every run as the index holds it, by run id: a record without its series, telemetry,
        overrides and error (run_id, experiment, cell, status, seeds, config, data, numerics,
        summary, wall_s, provenance). Runs of one config share its `config` dict."""
        index = self.index()
        configs, provs = self.configs(), index.provenances()
        out = []
        for row in index.rows():
            config, data, _ = configs[row[7]]
            record = {"run_id": row[0], "experiment": row[1], "cell": row[2], "status": row[3]}
            record["seeds"] = dict(zip(STREAMS, row[4:7], strict=True))
            record |= {"config": config, "data": data, "numerics": row[9], "wall_s": row[10]}
            record |= {"summary": json.loads(row[11]), "provenance": provs[row[12]]}
            out.append(record)
        return out

    def frame(
        self, columns: Sequence[str] = FRAME_COLUMNS, run_ids: Sequence[str] | None = None
    ) -> pd.DataFrame:
        """Every run (or those of `run_ids`) as the index holds it, one row per run id in id
        order, from one query: the index's `columns` (`fp4lab.sweep.index.COLUMNS`, run_id
        first: the summary as JSON text, the config and provenance by key, which `configs` and
        `Index.provenances` resolve), and config_id where config_key is among them."""
        where = "" if run_ids is None else f"run_id IN ({', '.join('?' * len(run_ids))})"
        rows = self.index().rows(where, tuple(run_ids or ()), columns=", ".join(columns))
        values = zip(*rows, strict=True) if rows else [()] * len(columns)
        by_column = zip(columns, values, strict=True)
        frame = pd.DataFrame(  # text as object: converting it to pandas' str costs more here
            {c: pd.Series(v, dtype=_NUMBERS.get(c, object)) for c, v in by_column}
        )
        if "config_key" in columns:
            ids = {key: cid for key, (_, _, cid) in self.configs().items()}
            frame["config_id"] = frame["config_key"].map(ids)
        return frame

    def detailed(self, chosen: pd.DataFrame) -> pd.DataFrame:
        """`chosen` (rows of a `frame`, e.g. of the `LABEL_COLUMNS`) with the rest of the
        `FRAME_COLUMNS`: a few runs read by id, many in one scan of the index."""
        rest = [c for c in FRAME_COLUMNS if c not in chosen.columns]
        if not rest:
            return chosen
        few = len(chosen) <= _FEW
        more = self.frame(["run_id", *rest], chosen["run_id"].tolist() if few else None)
        at = pd.Index(more["run_id"]).get_indexer(chosen["run_id"])
        taken = {c: pd.Series(more[c].to_numpy()[at], chosen.index, more[c].dtype) for c in rest}
        return chosen.assign(**taken)

    def configs(self) -> dict[str, tuple[dict, dict, str]]:
        """{config key: (config, data hashes, config id)} of the index: one dict per config for
        this Store's life, new ones added as the index grows."""
        self._config_cache |= self.index().configs(self._config_cache)
        return self._config_cache

    def made(self, frame: pd.DataFrame | None = None) -> dict[str, tuple[str, str, str]]:
        """{run id: (the cell its record names, its config id, its status: "damaged" where a
        damaged part spoils it)} of every run, from one query of the index or from the folder's
        `frame` when read: what `fp4lab.sweep.cells.checked` and `fp4lab ls` read."""
        columns = ["run_id", "cell", "config_key", "status"]
        if frame is None:
            rows = self.index().rows(columns=", ".join(columns))
        else:
            rows = zip(*(frame[c].tolist() for c in columns), strict=True)
        ids = {key: cid for key, (_, _, cid) in self.configs().items()}
        bad = self.damaged()
        return {r: (c, ids[k], "damaged" if r in bad else s) for r, c, k, s in rows}

    def current_ids(
        self, manifest: dict[str, Any] | None = None, frame: pd.DataFrame | None = None
    ) -> dict[str, str]:
        """{run id: cell label} of the manifest's cells (empty without one) as the records bear
        them out (`fp4lab.sweep.cells.checked`); `frame`: the folder's `frame`, when read."""
        manifest = self.experiment() if manifest is None else manifest
        if not manifest:
            return {}
        pooled = checked(manifest, self.made(frame))
        return {r: c["label"] for c in pooled for r in c["run_ids"]}


# ---------------------------------------------------------------------------------------------
# Loading as pandas.


@dataclasses.dataclass
class Results:
    """A results folder as DataFrames (see the module docstring for the columns)."""

    path: Path
    runs: pd.DataFrame
    metrics: pd.DataFrame
    experiment: dict[str, Any] | None = None
    provenance: pd.DataFrame | None = None
    stale: bool = False  # these are the stale runs (`load(..., stale=True)`)
    n_stale: int = 0  # stale records in the folder (not in these tables unless `stale`)
    config_fields: tuple[str, ...] = ()  # the config columns of `runs`, in the config's order


def label_runs(frame: pd.DataFrame, current: dict[str, str], stale: bool = False) -> pd.DataFrame:
    """The rows of a `Store.frame` to show, with their cell `label`. Current runs take the
    manifest's label; stale runs (and runs of a folder without a manifest whose label spans
    several configs) get their config id appended, so runs of different configs never share a
    label. Without a manifest (`current` empty) every run counts as current and none as
    stale."""
    if current and not stale:
        label = frame["run_id"].map(current)
        return frame.assign(label=label)[label.notna()]
    if stale and not current:
        return frame.iloc[:0].assign(label=pd.Series(dtype=object))
    chosen = frame[frame["run_id"].map(current).isna()] if current else frame
    tag = chosen.groupby("cell")["config_id"].transform("nunique") > 1
    prefix = " [stale " if stale else " ["
    tagged = chosen["cell"] + prefix + chosen["config_id"] + "]"
    return chosen.assign(label=tagged.where(tag | stale, chosen["cell"]))


# the per-step series a run records (besides telemetry keys), for load's did-you-mean
RECORDED_SERIES = ("loss", "grad_norm", "loss_scale", "loss_hp", *SIGNALS)


def load(
    path: str | os.PathLike,
    *,
    stale: bool = False,
    metrics: bool | str | Sequence[str] = True,
    cells: Sequence[str] | None = None,
    seeds: dict[str, Sequence[int]] | None = None,
) -> Results:
    """The runs and metrics of a results folder (see the module docstring). The runs and
    provenance come from the folder's index (`fp4lab.sweep.index`); only `metrics` opens the
    metrics files or compacted parts, reading just the rows asked for.

    Args:
      path: a results folder (the one holding experiment.json and runs/).
      stale: False: the runs of the experiment's current cells. True: the stale runs only
        (records the current experiment file no longer asks for), each cell label tagged with
        its config id, so different configs never pool.
      metrics: True: every metric; False: none (the metrics table is empty; nothing but the
        index is read); a name or a list of names: those metrics only.
      cells: only the runs of these cell labels (as `runs["cell"]` shows them).
      seeds: only the runs whose seeds are among these, per stream, e.g. {"init": [0, 1]}.
    Raises:
      FileNotFoundError: no such folder. StoreError: `path` is a file. ValueError: a bad
      argument (an unknown cell or stream), in one line.
    """
    names = frames.metric_names(metrics)
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no results folder at {p}")
    if not p.is_dir():
        raise StoreError(f"{p} is a file; load a results folder (the one holding runs/)")
    store = Store(p)
    manifest = store.experiment()
    frame = store.frame(FRAME_COLUMNS if cells is None and seeds is None else LABEL_COLUMNS)
    current = store.current_ids(manifest, frame)
    n_stale = len(frame) - len(current.keys() & set(frame["run_id"].tolist())) if current else 0
    chosen = store.detailed(frames.filtered(label_runs(frame, current, stale), cells, seeds))
    name = manifest["name"] if manifest and not stale and current else None
    configs, summaries = store.configs(), frames.summaries(chosen)
    runs, fields = frames.runs_frame(
        chosen, configs, summaries, name, lambda config: ID_DEFAULTS | identity(config)
    )
    if manifest and len(runs):  # cells in the order the experiment adds them
        order = {c.get("label"): i for i, c in enumerate(manifest["cells"])}
        key = runs["cell"].map(lambda c: order.get(c, len(order)))
        runs = runs.assign(_o=key).sort_values(["_o", "cell", *SEED_COLUMNS], kind="stable")
        runs = runs.drop(columns="_o").reset_index(drop=True)
    table = frames.metrics_frame(store, chosen, configs, summaries, names)
    if isinstance(names, list) and len(chosen):  # a name no run has: said, not an empty table
        found = set(table["metric"].unique())
        for missing in (n for n in names if n not in found):
            hint = did_you_mean(missing, sorted((found | set(RECORDED_SERIES)) - {missing}))
            if missing in RECORDED_SERIES:
                hint = " (a series these runs' configs or task do not record)"
            warnings.warn(f"load({p}): no run here has the metric {missing!r}{hint}", stacklevel=2)
    provenance_frame = frames.provenance_frame(chosen, store.index().provenances())
    return Results(p, runs, table, manifest, provenance_frame, stale, n_stale, fields)
