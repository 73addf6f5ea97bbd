"""The summary index of a results folder: what `ls`, `show`, resume and `load(metrics=False)` read.

`<out>/index.sqlite` is an SQLite database in WAL mode with one row per run record: its run id,
experiment, cell, status, seeds, config (deduplicated: one row per distinct config and data
hashes, with its config id), code version, numerics version, summary, wall seconds and
provenance (deduplicated too), and where the record lives (`runs/<run_id>.json`, or a part of
the compacted dataset, `fp4lab.sweep.compact`). Nothing in it is original: it is derived from the
run files, and `refresh` brings it up to date with them: files whose size or modification time
changed since it last read them (a record and its metrics file) are read and checked again
(`fp4lab.sweep.records.read_record`), removed ones dropped, new or changed compacted parts read
(`fp4lab.sweep.compact.check_part`). Bad entries get no row: they are read again by each
refresh, which warns once per process. A damaged part is kept with what is wrong with it and
the runs it damages (`damaged`), which every reader reports. Deleting the file loses nothing;
the next reader rebuilds it.

A cache that cannot change an answer: every row carries a checksum of its values (`check`, a
CRC-32 of their `marshal` bytes; a runs row has a second one of the columns `ls` and resume
read, so they read no more), verified whenever it is read. A mismatch, a page SQLite
cannot decode or a malformed file is reported in one warning line and the index is rebuilt from
the run files; an index file that cannot be written (while its folder can) is replaced, for this
process, by one in memory, built from the files, with one warning line saying why. Values are
never served from a row whose checksum fails.

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
import marshal
import math
import operator
import os
import sqlite3
import warnings
import zlib
from collections.abc import Callable, Container, Iterator
from pathlib import Path
from typing import Any

from fp4lab.schema import STREAMS
from fp4lab.sweep import compact
from fp4lab.sweep.records import CorruptRecord, canonical, read_record

__all__ = ["INDEX_FILE", "RUNS_RANK", "Index", "Row", "stamp_of"]

INDEX_FILE = "index.sqlite"
FORMAT = 5  # the layout of the tables below; another layout is rebuilt from the files
RUNS_RANK = 1 << 30  # precedence of a record in runs/ over any compacted part (rank = part no.)
Row = tuple  # run_id, experiment, cell, status, seed_init, seed_data, seed_quant, config_key,
# code, numerics, wall_s, summary (JSON), prov_key, has_file (metrics in a Parquet file, not in
# the JSON), source ("runs" or the records part), rank (precedence)
COLUMNS = "run_id, experiment, cell, status, seed_init, seed_data, seed_quant, config_key, "
COLUMNS += "code, numerics, wall_s, summary, prov_key, has_file, source, rank"
_NAMES = [c.strip() for c in COLUMNS.split(",")]
# a runs row's two checks: "check" of the columns `ls` and resume read, "full_check" of all; a
# reader reads (and checks) the first where it asks for no other column, else the second
_LABEL = ("run_id", "cell", "config_key", "status", "code", "source", "rank")
# each table's checked columns; `check` is the CRC-32 of their values (`_check`)
_TABLES = {
    "runs": COLUMNS,
    "configs": "config_key, config, data, config_id",
    "provenance": "prov_key, provenance",
    "parts": "name, stamp, damage, held",
}
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS runs ({COLUMNS}, stamp TEXT, "check" INTEGER, full_check INTEGER,
                                 PRIMARY KEY (run_id, source));
CREATE INDEX IF NOT EXISTS runs_source ON runs (source);
CREATE TABLE IF NOT EXISTS configs ({_TABLES["configs"]}, "check" INTEGER,
                                    PRIMARY KEY (config_key));
CREATE TABLE IF NOT EXISTS provenance ({_TABLES["provenance"]}, "check" INTEGER,
                                       PRIMARY KEY (prov_key));
CREATE TABLE IF NOT EXISTS parts ({_TABLES["parts"]}, "check" INTEGER, PRIMARY KEY (name));
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


class Damaged(Exception):
    """An index row whose checksum does not hold (`Index` rebuilds the index from the files)."""


def stamp_of(*stats: os.stat_result | None) -> str:
    """What tells a changed file: size and modification time (ns) of each of its files."""
    return ";".join("-" if s is None else f"{s.st_size}:{s.st_mtime_ns}" for s in stats)


def _key(obj) -> str:
    return hashlib.sha256(canonical(obj).encode()).hexdigest()[:16]


def _check(values: tuple) -> int:
    """The checksum of a row's values as SQLite returns them (text, int, float, None):
    marshal's version 0 writes each by value (no references, no interning)."""
    return zlib.crc32(marshal.dumps(values, 0))


def _verified(rows: list[tuple], table: str) -> list[tuple]:
    """`rows` (each: the table's checked columns, then its check) less their check; raises
    `Damaged` naming the first row whose check fails."""
    for row in rows:
        if _check(row[:-1]) != row[-1]:
            raise Damaged(f"a row of table {table} does not match its checksum ({row[0]!r})")
    return [row[:-1] for row in rows]


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
        self.version = f"{FORMAT}/{version}/{marshal.version}"
        self.memory = False  # whether this process keeps the index in memory
        self._recovering = False
        self.db: sqlite3.Connection | None = None
        try:
            self.db = self._open()
        except sqlite3.DatabaseError as e:  # not a database, or one that cannot be written
            self._recover(str(e))

    def _open(self) -> sqlite3.Connection:
        path = self.folder / INDEX_FILE
        if self.memory or not self.folder.is_dir() or not os.access(self.folder, os.W_OK):
            self.memory = True  # a read-only folder: this reader's own copy
            path = ":memory:"
        db = sqlite3.connect(path, timeout=60, isolation_level=None)
        try:
            if not self.memory:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
            db.executescript("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            found = db.execute("SELECT value FROM meta WHERE key='version'").fetchone()
            if found is None or found[0] != self.version:  # another layout: built anew
                with self.transaction(db):
                    for table in (*_TABLES, "meta"):  # their indexes go with them
                        db.execute(f"DROP TABLE IF EXISTS {table}")
                    for statement in _SCHEMA.split(";"):
                        db.execute(statement)
                    db.execute("INSERT INTO meta VALUES ('version', ?)", (self.version,))
        except BaseException:
            db.close()
            raise
        return db

    def _guarded(self, work: Callable[[], Any]) -> Any:
        """`work()`; where the index is damaged (a row whose check fails, a page SQLite cannot
        decode, a malformed file) or cannot be written, one warning line says so, the index is
        made anew from the files (`_recover`) and `work` runs again."""
        try:
            return work()
        except (sqlite3.DatabaseError, Damaged) as e:
            if self._recovering:
                raise
            self._recover(str(e).split(" with text ")[0])  # not the undecodable text
        return work()

    def _recover(self, why: str) -> None:
        """Replaces a damaged index by one rebuilt from the files (in memory where its file
        cannot be written), with one warning line."""
        folder = (self.folder / INDEX_FILE).is_dir()  # nothing to remove: kept in memory
        readonly = "readonly" in why or self.memory or folder
        then = "it is rebuilt from the run files"
        if readonly:
            then = "this process keeps the index in memory, built from the run files"
        what = "cannot be written" if "readonly" in why else "is damaged"
        if folder:
            what, why = "is a folder", "not the index's file; move it away to keep an index"
        warnings.warn(f"{self.folder / INDEX_FILE} {what} ({why}); {then}", CorruptRecord, 4)
        if self.db is not None:
            with contextlib.suppress(sqlite3.Error):
                self.db.close()
        if not readonly:
            for f in self.folder.glob(f"{INDEX_FILE}*"):
                with contextlib.suppress(OSError):
                    f.unlink()
        self._recovering, self.memory = True, readonly
        try:
            try:
                self.db = self._open()
                self._refresh()
            except (sqlite3.DatabaseError, Damaged):  # the new file fails too: in memory
                if self.memory:
                    raise
                if self.db is not None:
                    with contextlib.suppress(sqlite3.Error):
                        self.db.close()
                self.memory = True
                self.db = self._open()
                self._refresh()
        finally:
            self._recovering = False

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

    def _insert(self, table: str, values: tuple, verb: str = "INSERT OR REPLACE") -> None:
        marks = ", ".join("?" * (len(values) + 1))
        statement = f'{verb} INTO {table} ({_TABLES[table]}, "check") VALUES ({marks})'
        self.db.execute(statement, (*values, _check(values)))

    def put(self, record: dict[str, Any], source: str, rank: int, stamp: str) -> None:
        """Adds (or replaces) the row of one checked record found at `source`."""
        config, data = record["config"], record.get("data") or {}
        config_key = _key([config, data])
        prov = record.get("provenance")
        prov_key = _key(prov)
        db = self.db
        if not db.execute("SELECT 1 FROM configs WHERE config_key=?", (config_key,)).fetchone():
            cid = self.config_id(config, data)
            self._insert("configs", (config_key, json.dumps(config), json.dumps(data), cid))
        self._insert("provenance", (prov_key, json.dumps(prov)), "INSERT OR IGNORE")
        seeds = record["seeds"]
        wall = record.get("wall_s")
        values = (
            record["run_id"],
            record["experiment"],
            record["cell"],
            record["status"],
            *(seeds[s] for s in STREAMS),
            config_key,
            self.code_version(prov),
            record.get("numerics", 1),
            None if wall is None or math.isnan(wall) else float(wall),  # SQLite: NaN -> NULL
            json.dumps(record.get("summary") or {}),
            prov_key,
            int(record.get("metrics") is not None),
            source,
            rank,
        )
        named = dict(zip(_NAMES, values, strict=True))
        checks = (_check(tuple(named[c] for c in _LABEL)), _check(values))
        marks = ", ".join("?" * (len(values) + 3))
        db.execute(
            f'INSERT OR REPLACE INTO runs ({COLUMNS}, stamp, "check", full_check) VALUES ({marks})',
            (*values, stamp, *checks),
        )

    def write(self, record: dict[str, Any], stamp: str) -> None:
        """The row of a record just written to `runs/` (by the sweep holding the writer lock)."""

        def write():
            with self.transaction(self.db):
                self.put(record, "runs", RUNS_RANK, stamp)

        self._guarded(write)

    def refresh(self) -> None:
        """Brings the index up to date with the files of `runs/` and the compacted parts
        (`fp4lab.sweep.compact.parts`, read with `check_part`), in one transaction. Bad files
        are read again each time (`read_record` warns once per process)."""
        self._guarded(self._refresh)

    def _refresh(self) -> None:
        files = _scan(self.folder / "runs")
        db = self.db
        known = dict(db.execute("SELECT run_id, stamp FROM runs WHERE source='runs'"))
        seen = {row[0]: row[1] for row in self._parts()}
        parts = compact.parts(self.folder)
        changed = [rid for rid, st in files.items() if known.get(rid) != st]
        gone = [rid for rid in known if rid not in files]
        new_parts = [(n, s, r) for n, s, r in parts if seen.get(n) != s]
        gone_parts = set(seen) - {n for n, _, _ in parts}
        if not (changed or gone or new_parts or gone_parts):
            return
        runs = self.folder / "runs"
        records = {rid: read_record(runs / f"{rid}.json") for rid in changed}  # outside the lock
        from_parts = [(n, s, r, compact.check_part(self.folder, n)) for n, s, r in new_parts]
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
            for name, stamp, rank, (part, damage, held) in from_parts:
                for record in part:
                    self.put(record, name, rank, stamp)
                self._insert("parts", (name, stamp, damage, json.dumps(sorted(held))))

    # -- reading ------------------------------------------------------------------------------

    def _parts(self) -> list[tuple]:
        rows = self.db.execute(f'SELECT {_TABLES["parts"]}, "check" FROM parts').fetchall()
        return _verified(rows, "parts")

    def rows(self, where: str = "", args: tuple = (), columns: str = COLUMNS) -> list[Row]:
        """The current row of each run (the file in runs/ first, then the latest part), in run
        id order, each checked (module docstring); `where`: an SQL condition on the columns;
        `columns`: those to return (the run id first). One scan of the table: a run id in two
        places is rare, and resolved here rather than by a GROUP BY (which reads the table
        through its key, twice as slow)."""
        where = f"WHERE {where}" if where else ""
        names = [c.strip() for c in columns.split(",")]
        selected, check = (
            (_LABEL, '"check"') if set(names) <= set(_LABEL) else (_NAMES, "full_check")
        )
        at, n = [selected.index(c) for c in names], len(selected)

        def read():
            found = self.db.execute(
                f"SELECT {', '.join(selected)}, {check} FROM runs {where}", args
            )
            rows = found.fetchall()
            for row in rows:
                if zlib.crc32(marshal.dumps(row[:n], 0)) != row[n]:  # `_check`, inline
                    raise Damaged(f"a row of table runs fails its checksum ({row[0]!r})")
            return rows

        rows = self._guarded(read)
        if len({row[0] for row in rows}) < len(rows):
            rank = selected.index("rank")
            rows.sort(key=lambda row: row[rank])
            rows = list({row[0]: row for row in rows}.values())
        rows.sort(key=lambda row: row[0])
        take = operator.itemgetter(*at)
        return [take(row) for row in rows] if len(at) > 1 else [(take(row),) for row in rows]

    def configs(self, known: Container[str] = ()) -> dict[str, tuple[dict, dict, str]]:
        """{config key: (config, data hashes, config id)}, but for the `known` keys."""

        def read():
            found = self.db.execute(f'SELECT {_TABLES["configs"]}, "check" FROM configs')
            return _verified(found.fetchall(), "configs")

        rows = self._guarded(read)
        return {k: (json.loads(c), json.loads(d), i) for k, c, d, i in rows if k not in known}

    def provenances(self) -> dict[str, Any]:
        def read():
            found = self.db.execute(f'SELECT {_TABLES["provenance"]}, "check" FROM provenance')
            return _verified(found.fetchall(), "provenance")

        return {k: json.loads(p) for k, p in self._guarded(read)}

    def damaged(self) -> list[tuple[str, str, list[str]]]:
        """[(part, what is wrong with it, the run ids it damages)] of the damaged compacted
        parts (`fp4lab.sweep.compact.check_part`), as the index read them."""
        rows = self._guarded(self._parts)
        return [(name, damage, json.loads(held)) for name, _, damage, held in rows if damage]

    def damaged_runs(self) -> dict[str, str]:
        """{run id: the damaged part that spoils it} of the runs a damaged part holds (or held)
        that no record elsewhere (in runs/, in a later part) supersedes."""
        broken = self.damaged()
        if not broken:
            return {}
        where = dict(self.rows(columns="run_id, source"))
        return {rid: part for part, _, ids in broken for rid in ids if where.get(rid, part) == part}

    def report_damaged(self) -> None:
        """One warning line per damaged part that spoils current runs: the part, what is wrong,
        those runs; given by every reader, every time (not once per process)."""
        spoiled = self.damaged_runs()
        for part, why, _ in self.damaged():
            ids = sorted(r for r, p in spoiled.items() if p == part)
            if ids:
                shown = ", ".join(ids[:4]) + (", ..." if len(ids) > 4 else "")
                text = (
                    f"{self.folder / part}: damaged compacted part ({why}); its {len(ids)} runs "
                    f"({shown}) count as damaged and a rerun computes them again"
                )
                warnings.warn_explicit(
                    text, CorruptRecord, str(self.folder / part), 1, __name__, {}
                )

    def dump(self) -> dict[str, list]:
        """Every table's rows, sorted (two indexes of the same files dump equal)."""
        return {t: sorted(self.db.execute(f"SELECT * FROM {t}")) for t in _TABLES}


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
