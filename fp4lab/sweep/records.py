"""Record files on disk: atomic writes with ordinary permissions, checked reads, bad entries.

Every file of a results folder is written to a temporary name in its folder, flushed, renamed
into place, and the folder flushed after the rename (`fsync_dir`), so a killed sweep or a power
loss leaves whole files or none, and no temporary file stays behind a write that fails. Files
get mode 0666 minus the umask (0644 under the usual umask 022), like any file a program creates,
so others on a shared machine can read them. A write that fails (a read-only folder, a full
disk) raises `StoreError` naming the file and the reason.

A run record is read only if it is a regular file that parses, whose checksum matches, whose name
is its run id and which has the fields every record has (`check_record`), and, when its per-step
metrics are in a Parquet file beside it (schema 3), if that file's sha256 is the one the record
(and so its checksum) holds. Anything else, whatever it contains (a file nested too deeply to
parse included), is a bad entry: skipped with one `CorruptRecord` warning naming the file and
what is wrong (each bad file is reported once per process while it stays unchanged), and its run
is redone.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from fp4lab.schema import STREAMS

__all__ = [
    "SCHEMA",
    "STATUSES",
    "CorruptRecord",
    "StoreError",
    "canonical",
    "check_record",
    "file_mode",
    "file_sha256",
    "fsync_dir",
    "read_json",
    "read_record",
    "seal",
    "warn_bad",
    "write_atomic",
]

SCHEMA = 3  # the layout of a record; 2: data hashes, numerics version and code provenance;
# 3: the per-step metrics in <run_id>.parquet beside the record, named with their sha256 in it
READABLE = (1, 2, 3)  # older records (metrics inside the JSON) are read as they are
STATUSES = ("ok", "failed")
_WARNED: set[tuple] = set()


class StoreError(Exception):
    """A results folder that cannot be written or read as asked: the message names the path."""


class CorruptRecord(UserWarning):
    """A bad entry of a results folder (unparsable, checksum mismatch, a field missing, not a
    file); it is skipped, and its run is redone."""


def canonical(obj) -> str:
    """The canonical JSON text of `obj` (sorted keys, no spaces): what ids and checksums hash."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON-able: {type(value).__name__}")


def file_mode() -> int:
    """The mode of a new results file: 0666 minus the umask."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def write_atomic(path: Path, text: str | bytes) -> None:
    """Writes `text` (or bytes) to `path` atomically (temporary file, fsync, rename, fsync of
    the folder), mode 0666 & ~umask. On any failure the temporary file is removed.

    Raises:
      StoreError: the folder cannot be created or written (read-only, full disk, ...).
    """
    tmp = None
    try:
        new_folder = not path.parent.is_dir()
        path.parent.mkdir(parents=True, exist_ok=True)
        if new_folder:  # its entry in the folder above, too
            fsync_dir(path.parent.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            os.fchmod(f.fileno(), file_mode())
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        fsync_dir(path.parent)  # the rename itself survives a power loss only once this returns
    except OSError as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        why = e.strerror or str(e)
        if e.errno == errno.ENOSPC:
            why = "no space left on the device"
        raise StoreError(f"{path}: cannot write the results file: {why}") from e
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def fsync_dir(folder: Path) -> None:
    """Flushes a folder's entries (a rename into it, a new file) to the disk (POSIX: fsync of
    the folder). A filesystem that cannot fsync a folder (EINVAL) is left as it is.

    Raises:
      OSError: the folder cannot be opened or flushed (an I/O error).
    """
    if not hasattr(os, "O_DIRECTORY"):  # not POSIX (Windows): folders are not opened
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def seal(record: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(record as plain JSON with `schema` and `checksum` added, its file text)."""
    body = json.loads(json.dumps(record, default=_jsonable))
    body["schema"] = SCHEMA
    body["checksum"] = hashlib.sha256(canonical(body).encode()).hexdigest()
    return body, json.dumps(body, default=_jsonable)


def warn_bad(path: Path, what: str, stacklevel: int = 3) -> None:
    """One `CorruptRecord` warning "<path>: <what>", once per process per unchanged file."""
    try:
        st = path.stat()
        sig = (st.st_mtime_ns, st.st_size)
    except OSError:
        sig = None
    key = (str(path), what, sig)
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(f"{path}: {what}", CorruptRecord, stacklevel=stacklevel)


def read_json(path: Path) -> tuple[Any, str | None]:
    """(parsed JSON, None), or (None, what is wrong) for a missing, unreadable or bad file."""
    if not path.is_file():
        return None, "not a regular file" if path.exists() else "missing"
    try:
        return json.loads(path.read_text()), None
    except OSError as e:
        return None, f"cannot be read ({e.strerror})"
    except (ValueError, UnicodeDecodeError) as e:
        return None, f"does not parse as JSON ({e})"
    except RecursionError:  # the parser's stack, not ours: nested deeper than Python's limit
        return None, "does not parse as JSON (nested too deeply)"


def check_record(body: Any, stem: str) -> str | None:
    """What is wrong with a parsed record whose file is named `<stem>.json`, or None."""
    if not isinstance(body, dict):
        return f"holds a {type(body).__name__}, not a record"
    checksum = body.pop("checksum", None)
    if checksum is None:
        return "has no checksum"
    if hashlib.sha256(canonical(body).encode()).hexdigest() != checksum:
        return "checksum mismatch (edited or partly written)"
    if body.get("schema") not in READABLE:
        return f"record schema {body.get('schema')!r}; this fp4lab reads schemas {READABLE}"
    if body.get("run_id") != stem:
        return f"run_id {body.get('run_id')!r} does not match its file name"
    for field, kind in (("experiment", str), ("cell", str), ("config", dict), ("seeds", dict)):
        if not isinstance(body.get(field), kind):
            return f"field {field!r} is missing or not a {kind.__name__}"
    if body.get("status") not in STATUSES:
        return f"field 'status'={body.get('status')!r}; allowed: {', '.join(STATUSES)}"
    seeds = body["seeds"]
    if any(not isinstance(seeds.get(s), int) for s in STREAMS):
        return f"field 'seeds'={seeds!r}; needs an int per stream {STREAMS}"
    for field in ("summary", "series", "telemetry", "data", "provenance", "metrics"):
        if body.get(field) is not None and not isinstance(body[field], dict):
            return f"field {field!r} is not a dict"
    metrics = body.get("metrics")
    if metrics is not None and not (
        metrics.get("file") == f"{stem}.parquet" and isinstance(metrics.get("sha256"), str)
    ):
        return f"field 'metrics'={metrics!r}; needs file {stem}.parquet and its sha256"
    return None


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_record(path: Path) -> dict[str, Any] | None:
    """The record in `path`, or None with one warning naming the file and what is wrong."""
    body, why = read_json(path)
    if why is None:
        try:
            why = check_record(body, path.stem)
        except (RecursionError, TypeError, ValueError) as e:  # whatever the content holds
            why = f"cannot be checked ({type(e).__name__}: {e})"
    if why is None and body.get("metrics") is not None:
        metrics = path.with_name(body["metrics"]["file"])
        try:
            if file_sha256(metrics) != body["metrics"]["sha256"]:
                why = f"its metrics file {metrics.name} does not match the record's sha256"
        except OSError as e:
            why = f"its metrics file {metrics.name} cannot be read ({e.strerror or e})"
    if why is not None:
        warn_bad(path, f"bad run record, skipped: {why}", stacklevel=4)
        return None
    return body
