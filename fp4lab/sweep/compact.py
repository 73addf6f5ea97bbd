"""Compaction: a results folder's per-run files become one columnar dataset.

    fp4lab compact results/randomness_vs_error
    fl.sweep.compact("results/randomness_vs_error")

Each compaction writes one part of the folder's dataset, numbered from 1, and then deletes the
per-run files it holds:

    <out>/compact/metrics-0001.parquet   every compacted run's per-step metrics, long: run_id,
                                         cell (as recorded), seed_init, seed_data, seed_quant,
                                         step, metric, value; sorted by cell and run id, one
                                         row group per cell
    <out>/compact/records-0001.parquet   run_id, cell, status and each run's record, the text of
                                         its JSON file byte for byte (so its checksum still
                                         holds); the metadata names the metrics part's sha256

Both are written to temporary files, flushed and renamed into place, the metrics part first:
a records part exists only beside its whole metrics part. Only then are the per-run files
deleted. A `kill -9` at any point loses nothing: before the records part's rename the files are
all there; after it a run may be both in `runs/` and in the part, with the same record, and the
index (`fp4lab.sweep.index`) takes the file. A later compaction deletes such files. Compaction
holds the folder's writer lock, so no sweep writes meanwhile (and it removes the temporary files
of a compaction killed while it wrote); a sweep after it writes new runs
to `runs/` again (resume reads the index, which knows the compacted runs), and the next
compaction adds a part. Metrics are read lazily with `pyarrow.dataset`: the filters on run id,
cell and metric are pushed down to the row groups (`read_metrics`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from fp4lab.schema import STREAMS
from fp4lab.sweep import lock, metrics
from fp4lab.sweep.records import (
    StoreError,
    check_record,
    file_mode,
    file_sha256,
    fsync_dir,
    read_record,
    warn_bad,
)

__all__ = [
    "FOLDER",
    "METRICS_SCHEMA",
    "check_part",
    "compact",
    "parts",
    "read_metrics",
    "read_part",
]

FOLDER = "compact"
METRICS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("cell", pa.string()),
        ("seed_init", pa.int64()),
        ("seed_data", pa.int64()),
        ("seed_quant", pa.int64()),
        ("step", pa.int64()),
        ("metric", pa.string()),
        ("value", pa.float64()),
    ]
)
RECORDS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("cell", pa.string()),
        ("status", pa.string()),
        ("record", pa.string()),
    ]
)
_SHA = b"fp4lab.metrics_sha256"


def _number(path: Path) -> int:
    return int(path.stem.rsplit("-", 1)[1])


def parts(folder: Path) -> list[tuple[str, str, int]]:
    """[(name relative to the folder, stamp, number)] of the folder's records parts; the stamp
    tells a change of the records part or of its metrics part (size and modification time)."""
    out = []
    for p in sorted((Path(folder) / FOLDER).glob("records-[0-9]*.parquet")):
        stats = []
        for f in (p, _metrics_path(p)):
            try:
                st = f.stat()
                stats.append(f"{st.st_size}:{st.st_mtime_ns}")
            except OSError:
                stats.append("-")
        out.append((f"{FOLDER}/{p.name}", ";".join(stats), _number(p)))
    for m in sorted((Path(folder) / FOLDER).glob("metrics-[0-9]*.parquet")):
        if not m.with_name(m.name.replace("metrics-", "records-")).exists():
            _orphan(m)
    return out


def _orphan(metrics_part: Path) -> None:
    """Warns (once per process) of a metrics part whose records part is gone while its runs'
    files are gone too (compaction writes the metrics part first and removes the run files
    last, so a compaction under way or killed leaves them): those runs are lost to every
    reader (`ls` counts them missing)."""
    try:
        held = pq.read_table(metrics_part, columns=["run_id"])["run_id"].unique().to_pylist()
    except Exception:  # a damaged file too: nothing to tell which runs it held
        held = None
    runs = metrics_part.parent.parent / "runs"
    if held is not None:
        held = [rid for rid in held if not (runs / f"{rid}.json").exists()]
        if not held:
            return
    name = metrics_part.name.replace("metrics-", "records-")
    lost = f"the {len(held)} runs it held are lost" if held else "the runs it held are lost"
    warn_bad(
        metrics_part,
        f"its records part {name} is missing: {lost} (restore the file, or run the experiment "
        "again to compute them)",
    )


def _metrics_path(records_path: Path) -> Path:
    return records_path.with_name(records_path.name.replace("records-", "metrics-"))


def read_part(folder: Path, name: str, run_ids: Iterable[str]) -> list[dict]:
    """The records of `run_ids` in records part `name` that pass their checks (the part as a
    whole is checked by `check_part` when the index reads it)."""
    path = Path(folder) / name
    try:
        table = pq.read_table(path, schema=RECORDS_SCHEMA)
        table = table.filter(pc.is_in(table["run_id"], pa.array(list(run_ids), pa.string())))
    except Exception as e:  # whatever a damaged file makes the reader raise
        warn_bad(path, f"bad part, skipped: {e}")
        return []
    records, _, _ = _checked(path, table)
    return records


def check_part(folder: Path, name: str) -> tuple[list[dict], str | None, list[str]]:
    """(the records of records part `name` that pass their checks, what is wrong with the part
    or None, the run ids whose files it damages). The metrics part beside it must be the one the
    records part names (sha256); if it is not (missing, edited), the records still serve what
    they hold (summaries), and every run of the part is damaged (its metrics are not read). A
    records part that cannot be read damages the runs its metrics part names."""
    path = Path(folder) / name
    mpath = _metrics_path(path)
    try:
        table = pq.read_table(path, schema=RECORDS_SCHEMA)
        sha = (pq.read_schema(path).metadata or {}).get(_SHA, b"").decode()
    except Exception as e:  # whatever a damaged file makes the reader raise
        try:
            held = pq.read_table(mpath, columns=["run_id"])["run_id"].unique().to_pylist()
        except Exception:  # a damaged file
            held = []
        return [], f"{path.name} cannot be read ({_brief(e)})", held
    records, bad, why = _checked(path, table)
    damage = [f"{len(bad)} of its records fail their checks ({why})"] if bad else []
    try:
        metrics_ok = file_sha256(mpath) == sha
    except OSError as e:
        damage.append(f"{mpath.name} cannot be read ({e.strerror or e})")
        metrics_ok = False
    else:
        if not metrics_ok:
            damage.append(f"{mpath.name} is not the one it was written with (sha256)")
    if not metrics_ok:
        bad += [rid for rid in _strings(table["run_id"]) if rid is not None]
    return records, "; ".join(damage) or None, sorted(set(bad))


def _checked(path: Path, table: pa.Table) -> tuple[list[dict], list[str], str | None]:
    """(the records of a records part's `table` that pass `check_record`, the run ids of those
    that do not, what is wrong with the first); each bad one warned about once per process."""
    records, bad, first = [], [], None
    for rid, text in zip(_strings(table["run_id"]), _strings(table["record"]), strict=True):
        try:
            body = json.loads(text) if text is not None else None
            why = check_record(body, rid) if text is not None else "its bytes are not UTF-8"
        except (ValueError, TypeError, RecursionError) as e:
            body, why = None, f"does not parse ({_brief(e)})"
        if why is None:
            records.append(body)
            continue
        warn_bad(path, f"bad run record {rid} in the part, skipped: {why}", stacklevel=4)
        if rid is not None:
            bad.append(rid)
        if isinstance(body, dict) and isinstance(body.get("run_id"), str):
            bad.append(body["run_id"])  # the id its text names, where the column's is damaged
        first = first or why
    return records, bad, first


def _strings(column: pa.ChunkedArray) -> list[str | None]:
    """The values of a string `column`, None for each whose bytes are not UTF-8 (a flipped byte
    in a part: pyarrow's own conversion raises for the whole column)."""
    out: list[str | None] = []
    for raw in column.cast(pa.binary()).to_pylist():
        try:
            out.append(None if raw is None else raw.decode())
        except UnicodeDecodeError:
            out.append(None)
    return out


def _brief(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def read_metrics(
    folder: Path,
    name: str,
    run_ids: Iterable[str],
    names: Iterable[str] | None = None,
    cells: Iterable[str] | None = None,
) -> pa.Table:
    """The long metrics (run_id, step, metric, value) of `run_ids` in the metrics part beside
    records part `name`, only the metrics `names` if given; `cells`, the recorded cells of
    those runs, lets the scan skip other cells' row groups."""
    where = pc.field("run_id").isin(pa.array(sorted(set(run_ids)), pa.string()))
    if cells is not None:
        where &= pc.field("cell").isin(pa.array(sorted(set(cells)), pa.string()))
    if names is not None:
        where &= pc.field("metric").isin(pa.array(list(names), pa.string()))
    data = ds.dataset(_metrics_path(Path(folder) / name), format="parquet")
    columns = ["run_id", "step", "metric", "value"]
    return data.to_table(columns=columns, filter=where).cast(metrics.SCHEMA)


def _part_table(record: dict[str, Any], runs: Path) -> pa.Table:
    long = metrics.table_of(record, runs) if record.get("metrics") else metrics.SCHEMA.empty_table()
    n, seeds = long.num_rows, record["seeds"]
    extra = {"cell": pa.array([record["cell"]] * n, pa.string())}
    extra |= {f"seed_{s}": pa.array([seeds[s]] * n, pa.int64()) for s in STREAMS}
    cols = {c: long[c] for c in long.column_names} | extra
    return pa.table({f.name: cols[f.name] for f in METRICS_SCHEMA}, schema=METRICS_SCHEMA)


def _write(path: Path, write) -> str:
    """Writes a file with `write(tmp_path)`, flushes it, renames it to `path` and flushes the
    folder; returns its sha256."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        os.chmod(tmp, file_mode())
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        sha = file_sha256(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return sha


def compact(
    folder: str | os.PathLike, keep_metrics: Callable[[dict[str, Any]], bool] | None = None
) -> dict[str, int]:
    """Moves the valid run records of `folder/runs` and their metrics into a new part of the
    folder's dataset, then deletes their files (module docstring). Bad entries stay as they
    are. Holds the folder's writer lock.

    Args:
      folder: a results folder.
      keep_metrics: None keeps every run's per-step metrics; a predicate on a run's record
        keeps them only for the runs it is true of (a thinned folder, as the committed
        results/randomness_vs_error*: their rule is in results/README.md). The records, and
        so every run's summary, all stay; `fp4lab.sweep.reproduce` regenerates a dropped
        run's full record bit for bit.

    Returns:
      {"runs": runs compacted, "part": the new part's number (0: nothing to compact)}.
    Raises:
      FileNotFoundError: no such folder. StoreError: not a results folder, one that cannot be
        written, or a sweep writing it (`fp4lab.sweep.lock.FolderBusy`).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no results folder at {folder}")
    runs = folder / "runs"
    if not any((folder / f).exists() for f in ("runs", FOLDER, "experiment.json")):
        raise StoreError(
            f"{folder} is not a results folder (no experiment.json, runs/ or {FOLDER}/): "
            "nothing to compact"
        )
    with lock.writer(folder):
        for tmp in (folder / FOLDER).glob(".*.tmp"):  # a compaction killed while it wrote
            tmp.unlink()
        done = {rid: c for n, _, _ in parts(folder) for rid, c in _checksums(folder / n).items()}
        records, texts, dropped = [], {}, []
        for f in sorted(runs.glob("*.json")) if runs.is_dir() else ():
            record = read_record(f)
            if record is None:
                continue
            text = f.read_text()
            if done.get(record["run_id"]) == json.loads(text)["checksum"]:
                dropped.append(record)  # compacted already (a compaction killed before)
            else:
                records.append(record)
                texts[record["run_id"]] = text
        number = max((n for _, _, n in parts(folder)), default=0) + 1
        if records:
            (folder / FOLDER).mkdir(exist_ok=True)
            records.sort(key=lambda r: (r["cell"], r["run_id"]))
            mpath = folder / FOLDER / f"metrics-{number:04d}.parquet"
            kept = [r for r in records if keep_metrics is None or keep_metrics(r)]
            sha = _write(mpath, lambda tmp: _write_metrics(tmp, kept, runs))
            table = pa.table(
                {
                    "run_id": [r["run_id"] for r in records],
                    "cell": [r["cell"] for r in records],
                    "status": [r["status"] for r in records],
                    "record": [texts[r["run_id"]] for r in records],
                },
                schema=RECORDS_SCHEMA.with_metadata({_SHA: sha.encode()}),
            )
            rpath = folder / FOLDER / f"records-{number:04d}.parquet"
            _write(rpath, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
        for record in records + dropped:  # the record first: a lone metrics file is no record
            (runs / f"{record['run_id']}.json").unlink(missing_ok=True)
            if record.get("metrics"):
                (runs / record["metrics"]["file"]).unlink(missing_ok=True)
        for f in runs.glob("*.parquet") if runs.is_dir() else ():
            if f.stem in done and not f.with_suffix(".json").exists():  # its record went first
                f.unlink()
                dropped.append(f)
        if records or dropped:
            fsync_dir(runs)
    return {"runs": len(records), "part": number if records else 0}


def _checksums(path: Path) -> dict[str, str]:
    """{run id: checksum} of the records of a part that pass their checks (the runs of a
    damaged part are compacted again)."""
    try:
        table = pq.read_table(path, schema=RECORDS_SCHEMA)
    except Exception:  # a damaged file
        return {}
    texts = dict(zip(_strings(table["run_id"]), _strings(table["record"]), strict=True))
    return {
        b["run_id"]: json.loads(texts[b["run_id"]])["checksum"] for b in _checked(path, table)[0]
    }


def _write_metrics(tmp: str, records: list[dict], runs: Path) -> None:
    with pq.ParquetWriter(
        tmp, METRICS_SCHEMA, compression="zstd", use_dictionary=["run_id", "cell", "metric"]
    ) as writer:
        i = 0
        while i < len(records):  # one row group per cell
            j = i
            while j < len(records) and records[j]["cell"] == records[i]["cell"]:
                j += 1
            cell = pa.concat_tables([_part_table(r, runs) for r in records[i:j]])
            writer.write_table(cell, row_group_size=max(cell.num_rows, 1))
            i = j
