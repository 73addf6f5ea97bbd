"""Results on disk: one JSON file per finished run, written atomically, loadable as pandas.

Layout of a results folder:

    <out>/experiment.json        the sweep: name, source file, cells and their run ids
    <out>/runs/<run_id>.json     one run: config, seeds, status, summary, per-step series,
                                 telemetry, provenance, and a checksum of all of it

A run's id is a hash of its resolved config and its three seeds (`run_id`), so a re-run finds
finished runs and skips them. Each file is written to a temporary name in the same folder and
renamed into place: a killed sweep leaves whole files or none. A file that does not parse or whose
checksum does not match is reported as corrupt and its run is redone. Everything is JSON (no
pickle anywhere): loading someone else's results never runs their code. Non-finite floats are
written as JSON's NaN / Infinity extensions, which Python's json reads back.

`load(path)` gives a `Results` with two DataFrames:

    runs      one row per run: run_id, experiment, cell, status, seed_init, seed_data,
              seed_quant, one column per config field, the summary numbers, wall_s
    metrics   long: run_id, step, metric, value (loss, grad_norm, loss_scale, eval_loss and the
              telemetry keys quant/<layer>/<gemm>/<operand>/<stat>, grad/<layer>/<stat>)
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fp4lab.schema import SEED_COLUMNS, STREAMS

__all__ = ["SCHEMA", "Results", "Store", "run_id", "load", "provenance"]

SCHEMA = 1
_PACKAGES = ("fp4lab", "jax", "jaxlib", "flax", "optax", "ml_dtypes", "numpy")


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def run_id(config: dict[str, Any], seeds: tuple[int, int, int]) -> str:
    """The id of a run: sha256 of its resolved config and seeds (init, data, quant), 16 hex."""
    payload = {"config": config, "seeds": [int(s) for s in seeds], "schema": SCHEMA}
    return hashlib.sha256(_canonical(payload).encode()).hexdigest()[:16]


def provenance() -> dict[str, Any]:
    """Package versions, git revision, backend and device of this process."""
    import jax

    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev, dirty = "", ""
    device = jax.devices()[0]
    return {
        "versions": versions,
        "python": platform.python_version(),
        "git_revision": rev or None,
        "git_dirty": bool(dirty) if rev else None,
        "backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON-able: {type(value).__name__}")


class Store:
    """A results folder: finished runs by id, atomic writes, corrupt files detected."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.runs_dir = self.path / "runs"

    def file(self, rid: str) -> Path:
        return self.runs_dir / f"{rid}.json"

    def read(self, rid: str) -> dict[str, Any] | None:
        """The record of run `rid`, or None when it is absent or corrupt (corrupt: a warning)."""
        f = self.file(rid)
        if not f.exists():
            return None
        return _read_record(f)

    def finished(self, rid: str) -> bool:
        """Whether `rid` has a valid record with status "ok" (failed runs are retried)."""
        record = self.read(rid)
        return record is not None and record["status"] == "ok"

    def write(self, record: dict[str, Any]) -> Path:
        """Writes one run record atomically (its checksum added)."""
        body = json.loads(json.dumps(record, default=_jsonable))
        body["schema"] = SCHEMA
        body["checksum"] = hashlib.sha256(_canonical(body).encode()).hexdigest()
        f = self.file(body["run_id"])
        _write_atomic(f, json.dumps(body, default=_jsonable))
        return f

    def write_experiment(self, manifest: dict[str, Any]) -> None:
        _write_atomic(self.path / "experiment.json", json.dumps(manifest, indent=1))

    def experiment(self) -> dict[str, Any] | None:
        f = self.path / "experiment.json"
        return json.loads(f.read_text()) if f.exists() else None

    def records(self) -> list[dict[str, Any]]:
        """Every valid run record (corrupt ones skipped with a warning), by file name."""
        if not self.runs_dir.exists():
            return []
        out = []
        for f in sorted(self.runs_dir.glob("*.json")):
            record = _read_record(f)
            if record is not None:
                out.append(record)
        return out


class CorruptRecord(UserWarning):
    """A run file that does not parse or whose checksum does not match; it will be redone."""


def _read_record(f: Path) -> dict[str, Any] | None:

    try:
        body = json.loads(f.read_text())
        checksum = body.pop("checksum")
        ok = hashlib.sha256(_canonical(body).encode()).hexdigest() == checksum
        ok = ok and body.get("run_id") == f.stem and body.get("schema") == SCHEMA
    except (ValueError, KeyError, AttributeError, TypeError):
        ok = False
    if not ok:
        warnings.warn(
            f"{f}: corrupt or partial run record; the run will be redone",
            CorruptRecord,
            stacklevel=3,
        )
        return None
    return body


# ---------------------------------------------------------------------------------------------
# Loading as pandas.


@dataclasses.dataclass
class Results:
    """A results folder as DataFrames (see the module docstring for the columns)."""

    path: Path
    runs: pd.DataFrame
    metrics: pd.DataFrame
    experiment: dict[str, Any] | None = None


def _config_value(v):
    return json.dumps(v) if isinstance(v, list | dict) else v


def load(path: str | os.PathLike) -> Results:
    """The runs and metrics of a results folder (see the module docstring)."""
    store = Store(path)
    if not store.path.exists():
        raise FileNotFoundError(f"no results folder at {store.path}")
    rows, parts = [], []
    for r in store.records():
        seeds = r["seeds"]
        row = {
            "run_id": r["run_id"],
            "experiment": r["experiment"],
            "cell": r["cell"],
            "status": r["status"],
        }
        row |= {col: seeds[s] for s, col in zip(STREAMS, SEED_COLUMNS, strict=True)}
        row |= {k: _config_value(v) for k, v in r["config"].items()}
        row |= r.get("summary") or {}
        row["wall_s"] = r.get("wall_s", np.nan)
        rows.append(row)
        parts.extend(_metric_frames(r))
    runs = pd.DataFrame(rows)
    manifest = store.experiment()
    if manifest and len(runs):  # cells in the order the experiment adds them
        order = {c["label"]: i for i, c in enumerate(manifest.get("cells", []))}
        key = runs["cell"].map(lambda c: order.get(c, len(order)))
        runs = runs.assign(_o=key).sort_values(["_o", *SEED_COLUMNS], kind="stable")
        runs = runs.drop(columns="_o").reset_index(drop=True)
    if parts:
        metrics = pd.concat(parts, ignore_index=True)
    else:
        metrics = pd.DataFrame({"run_id": [], "step": [], "metric": [], "value": []})
    metrics = metrics.astype({"run_id": str, "step": np.int64, "metric": str, "value": np.float64})
    return Results(store.path, runs, metrics, manifest)


def _metric_frames(r: dict[str, Any]) -> list[pd.DataFrame]:
    out = []
    rid = r["run_id"]
    for name, values in (r.get("series") or {}).items():
        v = np.asarray(values, np.float64)
        out.append(_long(rid, np.arange(len(v)), name, v))
    tel = r.get("telemetry") or {}
    steps = np.asarray(tel.get("steps", []), np.int64)
    for name, values in (tel.get("metrics") or {}).items():
        out.append(_long(rid, steps, name, np.asarray(values, np.float64)))
    final = (r.get("summary") or {}).get("eval_loss")
    if final is not None:
        out.append(_long(rid, np.asarray([r["config"]["steps"]]), "eval_loss", np.asarray([final])))
    return out


def _long(rid: str, steps, metric: str, values) -> pd.DataFrame:
    return pd.DataFrame({"run_id": rid, "step": steps, "metric": metric, "value": values})
