"""The summary index of a results folder: what `ls`, `show`, resume and `load(metrics=False)` read.

`<out>/index.sqlite` is an SQLite database in WAL mode with one row per run record: its run id,
experiment, cell, status, seeds, config (deduplicated: one row per distinct config and data
hashes, with its config id), code version, numerics version, summary, wall seconds and
provenance (deduplicated too), and where the record lives (`runs/<run_id>.json`, or a part of
the compacted dataset, `fp4lab.sweep.compact`). Nothing in it is original: it is derived from the
run files, and `refresh` brings it up to date with them: files whose size or modification time
changed since it last read them (a record and its metrics file) are read and checked again
(`fp4lab.sweep.records.read_record`), removed ones dropped, new compacted parts read. Bad
entries get no row: they are read again by each refresh, which warns once per process.
Deleting the file loses nothing; the next reader rebuilds it.

A killed write never corrupts it: every change is one SQLite transaction, and a transaction cut
short is rolled back when the database is next opened. A sweep writes it under the folder's
writer lock (`fp4lab.sweep.lock`) as it writes each record; readers that find files it does not
know yet add them in a transaction of their own (SQLite serializes the two). Where the folder
cannot be written (a read-only checkout), the index is built in memory for the reader.

Precedence: a run id may have a record both in `runs/` and in a compacted part (a compaction
killed between writing the part and deleting the files, or a failed run redone after
compaction): the file in `runs/` wins, then the latest part.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
from collections.abc import Callable, Container, Iterable, Iterator
from pathlib import Path
from typing import Any

from fp4lab.schema import STREAMS
from fp4lab.sweep.records import canonical, read_record

__all__ = ["INDEX_FILE", "RUNS_RANK", "Index", "Row", "stamp_of"]

INDEX_FILE = "index.sqlite"
FORMAT = 1  # the layout of the tables below; another layout is rebuilt from the files
RUNS_RANK = 1 << 30  # precedence of a record in runs/ over any compacted part (rank = part no.)
Row = tuple  # run_id, experiment, cell, status, seed_init, seed_data, seed_quant, config_key,
# code, numerics, wall_s, summary (JSON), prov_key, has_file (metrics in a Parquet file, not in
# the JSON), source ("runs" or the records part), rank (precedence)
COLUMNS = "run_id, experiment, cell, status, seed_init, seed_data, seed_quant, config_key, "
COLUMNS += "code, numerics, wall_s, summary, prov_key, has_file, source, rank"
_TABLES = f"""
CREATE TABLE IF NOT EXISTS runs ({COLUMNS}, stamp TEXT, PRIMARY KEY (run_id, source));
CREATE INDEX IF NOT EXISTS runs_source ON runs (source);
CREATE TABLE IF NOT EXISTS configs (config_key TEXT PRIMARY KEY, config TEXT, data TEXT,
                                    config_id TEXT);
CREATE TABLE IF NOT EXISTS provenance (prov_key TEXT PRIMARY KEY, provenance TEXT);
CREATE TABLE IF NOT EXISTS parts (name TEXT PRIMARY KEY, stamp TEXT);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


def stamp_of(*stats: os.stat_result | None) -> str:
    """What tells a changed file: size and modification time (ns) of each of its files."""
    return ";".join("-" if s is None else f"{s.st_size}:{s.st_mtime_ns}" for s in stats)


def _key(obj) -> str:
    return hashlib.sha256(canonical(obj).encode()).hexdigest()[:16]


class Index:
    """The index of one results folder (see the module docstring).

    Args:
      folder: the results folder.
      config_id: (config, data hashes) -> a config's id (`fp4lab.sweep.store.config_id`).
      code_version: provenance -> its code version (`fp4lab.sweep.store.code_version`).
      version: what else the derived columns depend on (the numerics version): another value
        rebuilds the index.
    """

    def __init__(self, folder: Path, config_id: Callable, code_version: Callable, version: int):
        self.folder = Path(folder)
        self.config_id, self.code_version = config_id, code_version
        self.version = f"{FORMAT}/{version}"
        self.db = self._open()

    def _open(self) -> sqlite3.Connection:
        path = self.folder / INDEX_FILE
        try:
            if not self.folder.is_dir() or not os.access(self.folder, os.W_OK):
                raise sqlite3.OperationalError("read-only folder")
            db = sqlite3.connect(path, timeout=60, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_TABLES)
        except sqlite3.DatabaseError:  # read-only or not a database: this reader's own copy
            db = sqlite3.connect(":memory:", isolation_level=None)
            db.executescript(_TABLES)
        found = db.execute("SELECT value FROM meta WHERE key='version'").fetchone()
        if found is None or found[0] != self.version:
            with self.transaction(db):
                for table in ("runs", "configs", "provenance", "parts", "meta"):
                    db.execute(f"DELETE FROM {table}")
                db.execute("INSERT INTO meta VALUES ('version', ?)", (self.version,))
        return db

    @staticmethod
    @contextlib.contextmanager
    def transaction(db: sqlite3.Connection) -> Iterator[None]:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()

    # -- writing ------------------------------------------------------------------------------

    def put(self, record: dict[str, Any], source: str, rank: int, stamp: str) -> None:
        """Adds (or replaces) the row of one checked record found at `source`."""
        config, data = record["config"], record.get("data") or {}
        config_key = _key([config, data])
        prov = record.get("provenance")
        prov_key = _key(prov)
        db = self.db
        if not db.execute("SELECT 1 FROM configs WHERE config_key=?", (config_key,)).fetchone():
            cid = self.config_id(config, data)
            row = (config_key, json.dumps(config), json.dumps(data), cid)
            db.execute("INSERT INTO configs VALUES (?, ?, ?, ?)", row)
        db.execute("INSERT OR IGNORE INTO provenance VALUES (?, ?)", (prov_key, json.dumps(prov)))
        seeds = record["seeds"]
        wall = record.get("wall_s")
        db.execute(
            f"INSERT OR REPLACE INTO runs ({COLUMNS}, stamp) VALUES ({', '.join('?' * 17)})",
            (
                record["run_id"],
                record["experiment"],
                record["cell"],
                record["status"],
                *(seeds[s] for s in STREAMS),
                config_key,
                self.code_version(prov),
                record.get("numerics", 1),
                None if wall is None else float(wall),
                json.dumps(record.get("summary") or {}),
                prov_key,
                record.get("metrics") is not None,
                source,
                rank,
                stamp,
            ),
        )

    def write(self, record: dict[str, Any], stamp: str) -> None:
        """The row of a record just written to `runs/` (by the sweep holding the writer lock)."""
        with self.transaction(self.db):
            self.put(record, "runs", RUNS_RANK, stamp)

    def refresh(self, parts: Iterable[tuple[str, str, int]], read_part: Callable) -> None:
        """Brings the index up to date with the files of `runs/` and the compacted `parts`
        ([(name, stamp, rank)]; `read_part(name)` -> its checked records), in one transaction.
        Bad files are read again each time (`read_record` warns once per process)."""
        files = _scan(self.folder / "runs")
        db = self.db
        known = dict(db.execute("SELECT run_id, stamp FROM runs WHERE source='runs'"))
        seen = dict(db.execute("SELECT name, stamp FROM parts"))
        parts = list(parts)
        changed = [rid for rid, st in files.items() if known.get(rid) != st]
        gone = [rid for rid in known if rid not in files]
        new_parts = [(n, s, r) for n, s, r in parts if seen.get(n) != s]
        gone_parts = set(seen) - {n for n, _, _ in parts}
        if not (changed or gone or new_parts or gone_parts):
            return
        runs = self.folder / "runs"
        records = {rid: read_record(runs / f"{rid}.json") for rid in changed}  # outside the lock
        from_parts = [(n, s, r, read_part(n)) for n, s, r in new_parts]
        with self.transaction(db):
            for name in gone_parts | {n for n, _, _ in new_parts}:
                db.execute("DELETE FROM runs WHERE source=?", (name,))
                db.execute("DELETE FROM parts WHERE name=?", (name,))
            gone += [rid for rid, r in records.items() if r is None]
            db.executemany(
                "DELETE FROM runs WHERE run_id=? AND source='runs'", [(r,) for r in gone]
            )
            for rid, record in records.items():
                if record is not None:
                    self.put(record, "runs", RUNS_RANK, files[rid])
            for name, stamp, rank, part in from_parts:
                for record in part:
                    self.put(record, name, rank, stamp)
                db.execute("INSERT INTO parts VALUES (?, ?)", (name, stamp))

    # -- reading ------------------------------------------------------------------------------

    def rows(self, where: str = "", args: tuple = (), columns: str = COLUMNS) -> list[Row]:
        """The current row of each run (the file in runs/ first, then the latest part), in run
        id order; `where`: an SQL condition on the columns; `columns`: those to return (the
        run id first). One scan of the table: a run id in two places is rare, and resolved
        here rather than by a GROUP BY (which reads the table through its key, twice as slow)."""
        where = f"WHERE {where}" if where else ""
        rows = self.db.execute(f"SELECT {columns}, rank FROM runs {where}", args).fetchall()
        if len({row[0] for row in rows}) < len(rows):
            rows.sort(key=lambda row: row[-1])
            rows = list({row[0]: row for row in rows}.values())
        rows.sort(key=lambda row: row[0])
        return [row[:-1] for row in rows]

    def configs(self, known: Container[str] = ()) -> dict[str, tuple[dict, dict, str]]:
        """{config key: (config, data hashes, config id)}, but for the `known` keys."""
        rows = self.db.execute("SELECT config_key, config, data, config_id FROM configs")
        return {k: (json.loads(c), json.loads(d), i) for k, c, d, i in rows if k not in known}

    def provenances(self) -> dict[str, Any]:
        return {k: json.loads(p) for k, p in self.db.execute("SELECT * FROM provenance")}

    def dump(self) -> dict[str, list]:
        """Every table's rows, sorted (two indexes of the same files dump equal)."""
        tables = ("runs", "configs", "provenance", "parts")
        return {t: sorted(self.db.execute(f"SELECT * FROM {t}")) for t in tables}


def _scan(runs: Path) -> dict[str, str]:
    """{run id: stamp of its record and metrics files} of the *.json files in `runs`."""
    stats: dict[str, os.stat_result] = {}
    try:
        with os.scandir(runs) as entries:
            for e in entries:
                if e.name.endswith((".json", ".parquet")) and not e.name.startswith("."):
                    with contextlib.suppress(OSError):
                        stats[e.name] = e.stat()
    except (FileNotFoundError, NotADirectoryError):
        return {}
    return {
        n[:-5]: stamp_of(s, stats.get(f"{n[:-5]}.parquet"))
        for n, s in stats.items()
        if n.endswith(".json")
    }
