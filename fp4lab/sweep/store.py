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
seeds, the content hash of any data file it reads (`data_hashes`) and `NUMERICS_VERSION`, which
the code bumps whenever a change alters results on purpose. A rerun therefore skips exactly the
runs whose numbers it would reproduce, and recomputes the rest (an edited config or data file, a
numerics change). Files are written atomically (`fp4lab.sweep.records`); everything is JSON (no
pickle): loading someone else's results never runs their code.

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
import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from fp4lab.schema import RECORDED_BEFORE, SEED_COLUMNS, STREAMS
from fp4lab.sweep.cells import checked
from fp4lab.sweep.provenance import code_version, cpu, host, package_versions
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
_DATA_FIELDS = {"text": "text_path"}  # task -> the config field naming its data file


def data_hashes(config: dict[str, Any]) -> dict[str, str]:
    """{config field: sha256 of the file's bytes} for each data file the config reads.

    Raises:
      OSError: the file cannot be read (the experiment loader reports it with its cell).
    """
    if config.get("task") == "own":  # the file's source and the data files it declares
        return own.hashes(config["task_file"])
    field = _DATA_FIELDS.get(config.get("task"))
    if not field or not config.get(field):
        return {}
    return {field: hashlib.sha256(Path(config[field]).read_bytes()).hexdigest()}


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


def run_id(
    config: dict[str, Any], seeds: tuple[int, int, int], data: dict[str, str] | None = None
) -> str:
    """The id of a run, 16 hex: sha256 of its resolved config's `identity` (less the
    `ID_DEFAULTS` fields at their defaults and the `INERT` ones), its seeds (init, data,
    quant), the content hashes of its data files (`data_hashes`) and `NUMERICS_VERSION`."""
    payload = {"config": identity(config), "seeds": [int(s) for s in seeds], "schema": 1}
    if data:
        payload["data"] = data
    if NUMERICS_VERSION != 1:  # version 1 left out: the ids of the first stored results stay
        payload["numerics"] = NUMERICS_VERSION
    return hashlib.sha256(canonical(payload).encode()).hexdigest()[:16]


def provenance() -> dict[str, Any]:
    """What made a run: package versions, git revision (and whether the tree had edits),
    numerics version, python, backend, device kind and host CPU (`cpu`), time."""
    prov = host()
    return {"versions": prov.pop("versions"), "numerics": NUMERICS_VERSION, **prov}


class Store:
    """A results folder: records by run id, atomic writes, bad entries skipped with a warning."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.runs_dir = self.path / "runs"
        if self.path.exists() and not self.path.is_dir():
            raise StoreError(f"{self.path} is a file; a results folder is a directory")

    def file(self, rid: str) -> Path:
        return self.runs_dir / f"{rid}.json"

    def read(self, rid: str, metrics: bool = True) -> dict[str, Any] | None:
        """The record of run `rid`, or None when it is absent or bad (bad: one warning). With
        `metrics`, its series and telemetry are filled in from its Parquet file (if it has one),
        so the record reads as the run's full result whichever layout stored it."""
        f = self.file(rid)
        if not f.exists():
            return None
        record = read_record(f)
        return _with_metrics(record, self.runs_dir) if metrics and record else record

    def finished(self, rid: str) -> bool:
        """Whether `rid` has a valid record with status "ok" (failed runs are retried)."""
        record = self.read(rid, metrics=False)
        return record is not None and record["status"] == "ok"

    def write(self, record: dict[str, Any]) -> Path:
        """Writes one run record: its series and telemetry to `<run_id>.parquet`, then the rest
        as JSON with that file's name and sha256 (and the record's schema and checksum). Both
        are written atomically, the Parquet file first: a kill between the two leaves no record,
        and the run is redone."""
        record = dict(record)
        series = record.pop("series", None) or {}
        telemetry = record.pop("telemetry", None) or {}
        if series or telemetry:
            rid = record["run_id"]
            data = _parquet_bytes(_metrics_table(rid, series, telemetry))
            write_atomic(self.runs_dir / f"{rid}.parquet", data)
            record["metrics"] = {
                "file": f"{rid}.parquet",
                "sha256": hashlib.sha256(data).hexdigest(),
                "series": list(series),
            }
        body, text = seal(record)
        f = self.file(body["run_id"])
        write_atomic(f, text)
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
        """Every valid run record (bad entries skipped with one warning each), by file name;
        `metrics` as in `read`."""
        if not self.runs_dir.is_dir():
            return []
        out = []
        for f in sorted(self.runs_dir.glob("*.json")):
            record = read_record(f)
            if record is not None:
                out.append(_with_metrics(record, self.runs_dir) if metrics else record)
        return out

    def current_ids(self, manifest: dict[str, Any] | None = None, records=None) -> dict[str, str]:
        """{run id: cell label} of the manifest's cells (empty without one) as the records bear
        them out (`fp4lab.sweep.cells.checked`); `records`: the folder's, when already read."""
        manifest = self.experiment() if manifest is None else manifest
        records = self.records(metrics=False) if records is None and manifest else records or []
        return {r: c["label"] for c in checked(manifest, records, config_id) for r in c["run_ids"]}


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


def _config_value(v):
    return json.dumps(v) if isinstance(v, list | dict) else v


def label_runs(records, current: dict[str, str], stale: bool = False) -> list[tuple[dict, str]]:
    """(record, cell label) of the runs to show. Current runs take the manifest's label; stale
    runs (and runs of a folder without a manifest whose label spans several configs) get their
    config id appended, so runs of different configs never share a label. Without a manifest
    (`current` empty) every run counts as current and none as stale."""
    if current and not stale:
        return [(r, current[r["run_id"]]) for r in records if r["run_id"] in current]
    if stale and not current:
        return []
    chosen = [r for r in records if r["run_id"] not in current]
    ids = {id(r): config_id(r["config"], r.get("data")) for r in chosen}
    configs: dict[str, set] = {}
    for r in chosen:
        configs.setdefault(r["cell"], set()).add(ids[id(r)])
    out = []
    for r in chosen:
        tag = stale or len(configs[r["cell"]]) > 1
        out.append(
            (r, f"{r['cell']} [{'stale ' if stale else ''}{ids[id(r)]}]" if tag else r["cell"])
        )
    return out


def load(path: str | os.PathLike, *, stale: bool = False) -> Results:
    """The runs and metrics of a results folder (see the module docstring).

    Args:
      path: a results folder (the one holding experiment.json and runs/).
      stale: False: the runs of the experiment's current cells. True: the stale runs only
        (records the current experiment file no longer asks for), each cell label tagged with
        its config id, so different configs never pool.
    Raises:
      FileNotFoundError: no such folder. StoreError: `path` is a file.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no results folder at {p}")
    if not p.is_dir():
        raise StoreError(f"{p} is a file; load a results folder (the one holding runs/)")
    store = Store(p)
    manifest = store.experiment()
    records = store.records(metrics=False)
    current = store.current_ids(manifest, records)
    n_stale = sum(r["run_id"] not in current for r in records) if current else 0
    rows, parts, prov, fields = [], [], [], {}
    for r, label in label_runs(records, current, stale):
        seeds = r["seeds"]
        name = manifest["name"] if manifest and not stale and current else r["experiment"]
        row = {"run_id": r["run_id"], "experiment": name, "cell": label}
        row["status"] = r["status"]
        row |= {col: seeds[s] for s, col in zip(STREAMS, SEED_COLUMNS, strict=True)}
        row |= {k: _config_value(v) for k, v in (ID_DEFAULTS | identity(r["config"])).items()}
        fields |= dict.fromkeys(r["config"]) | dict.fromkeys(ID_DEFAULTS)
        row |= r.get("summary") or {}
        row["wall_s"] = r.get("wall_s", np.nan)
        rows.append(row)
        parts.extend(_metric_parts(r, store.runs_dir))
        prov.append(_provenance_row(r))
    runs = pd.DataFrame(rows)
    if manifest and len(runs):  # cells in the order the experiment adds them
        order = {c.get("label"): i for i, c in enumerate(manifest["cells"])}
        key = runs["cell"].map(lambda c: order.get(c, len(order)))
        runs = runs.assign(_o=key).sort_values(["_o", "cell", *SEED_COLUMNS], kind="stable")
        runs = runs.drop(columns="_o").reset_index(drop=True)
    if parts:
        metrics = pa.concat_tables(parts).to_pandas()
    else:
        metrics = pd.DataFrame({"run_id": [], "step": [], "metric": [], "value": []})
    metrics = metrics.astype({"run_id": str, "step": np.int64, "metric": str, "value": np.float64})
    columns = ["run_id", "numerics", "code", "jax", "jaxlib", "flax", "device"]
    columns += ["cpu", "backend", "python", "time_utc"]
    provenance_frame = pd.DataFrame(prov, columns=columns)
    return Results(
        p, runs, metrics, manifest, provenance_frame, stale, n_stale, config_fields=tuple(fields)
    )


def _provenance_row(r: dict[str, Any]) -> dict[str, Any]:
    prov = r.get("provenance") or {}
    versions = prov.get("versions") or {}
    row = {"run_id": r["run_id"], "numerics": r.get("numerics", 1), "code": code_version(prov)}
    row |= {k: versions.get(k) for k in ("jax", "jaxlib", "flax")}
    return row | {k: prov.get(k) for k in ("device", "cpu", "backend", "python", "time_utc")}


_METRICS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("step", pa.int64()),
        ("metric", pa.string()),
        ("value", pa.float64()),
    ]
)


def _metrics_table(rid: str, series: dict, telemetry: dict) -> pa.Table:
    """One run's per-step metrics, long, as an Arrow table (series first, then telemetry)."""
    names, steps, values = [], [], []
    for name, v in series.items():
        values.append(np.asarray(v, np.float64).ravel())
        steps.append(np.arange(len(values[-1]), dtype=np.int64))
        names.append(name)
    tel_steps = np.asarray(telemetry.get("steps", []), np.int64)
    for name, v in (telemetry.get("metrics") or {}).items():
        values.append(np.asarray(v, np.float64).ravel())
        steps.append(tel_steps)
        names.append(name)
    sizes = [len(v) for v in values]
    if not values:
        return _METRICS_SCHEMA.empty_table()
    metric = pa.DictionaryArray.from_arrays(
        np.repeat(np.arange(len(names), dtype=np.int32), sizes), pa.array(names, pa.string())
    )
    return pa.table(
        {
            "run_id": pa.array([rid] * sum(sizes), pa.string()),
            "step": np.concatenate(steps),
            "metric": metric.cast(pa.string()),
            "value": np.concatenate(values),
        },
        schema=_METRICS_SCHEMA,
    )


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", use_dictionary=["run_id", "metric"])
    return sink.getvalue()


def _read_metrics(path: Path) -> pa.Table:
    return pq.read_table(path, schema=_METRICS_SCHEMA)


def _with_metrics(record: dict[str, Any], runs_dir: Path) -> dict[str, Any]:
    """The record with `series` and `telemetry` filled in from its Parquet file (as the JSON of
    older records holds them: lists of numbers)."""
    pointer = record.get("metrics")
    if pointer is None:
        return record
    frame = _read_metrics(runs_dir / pointer["file"]).to_pandas()
    series, tel = {}, {"steps": [], "metrics": {}}
    for name, group in frame.groupby("metric", sort=False):
        if name in pointer.get("series", ()):
            series[name] = group["value"].tolist()
        else:
            tel["metrics"][name] = group["value"].tolist()
            tel["steps"] = group["step"].tolist()
    return record | {"series": series, "telemetry": tel}


def _metric_parts(r: dict[str, Any], runs_dir: Path) -> list[pa.Table]:
    """A run's rows of the metrics table: its Parquet file, or (older records) its series and
    telemetry from the JSON, then its final eval_loss."""
    rid = r["run_id"]
    if r.get("metrics") is not None:
        out = [_read_metrics(runs_dir / r["metrics"]["file"])]
    else:
        out = [_metrics_table(rid, r.get("series") or {}, r.get("telemetry") or {})]
    final = (r.get("summary") or {}).get("eval_loss")
    if final is not None:
        step = np.asarray([r["config"]["steps"]], np.int64)
        out.append(_metrics_table(rid, {}, {"steps": step, "metrics": {"eval_loss": [final]}}))
    return out
