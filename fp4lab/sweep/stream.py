"""`fp4lab run --stream`: each reported step of each run, appended to `<out>/stream.jsonl`.

One JSON object a line (`STREAM_FIELDS`), flushed as the steps arrive, so that another program
can follow a sweep while it runs (`tail -f`).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from fp4lab.sweep.experiment import Cell

__all__ = ["STREAM_FIELDS", "STREAM_FILE", "Stream"]

STREAM_FILE = "stream.jsonl"
STREAM_FIELDS = ("time", "run_id", "cell", "step", "loss", "grad_norm", "loss_scale")


class Stream:
    """The per-step lines of `stream.jsonl`: appended and flushed as the steps arrive."""

    def __init__(self, path: Path, work: list[tuple[Cell, list, list[str]]]):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "a")  # noqa: SIM115 (open for the sweep's duration)
        self.lock = threading.Lock()
        self.ids = []
        for cell, seeds, run_ids in work:  # the run ids the runner computed, once
            ids = {tuple(int(v) for v in s): rid for s, rid in zip(seeds, run_ids, strict=True)}
            self.ids.append((cell.label, ids))

    def write(self, index: int, event: dict[str, Any]) -> None:
        if event.get("event") != "step" or event.get("seed") is None:
            return
        cell, ids = self.ids[index]
        line = {
            "time": round(time.time(), 3),
            "run_id": ids.get(tuple(event["seed"])),
            "cell": cell,
        }
        line |= {k: event[k] for k in STREAM_FIELDS[3:] if k in event}
        with self.lock:
            self.file.write(json.dumps(line) + "\n")
            self.file.flush()

    def close(self) -> None:
        self.file.close()
