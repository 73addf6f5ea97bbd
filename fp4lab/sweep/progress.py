"""The progress of a sweep as it runs: a live display on a terminal, plain lines elsewhere.

`Progress` takes the runner's events (a batch compiling, a seed's step, a batch done or failed)
and shows the cells, runs and steps done with an estimate of the time left: rich's live display
when the stream is a terminal, else one line per event ("[1m40s] compiled cell ...").
"""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Any

__all__ = ["Progress"]


class Progress:
    """What a sweep shows while it runs, on stderr: compiles, steps inside cells, an ETA.

    Events come from the executors (`start`, `event`, `finish`); step events are the
    reports that `compute_cell` compiles into a cell, every k steps. On a terminal the display
    is a live `rich` progress display (one line for the sweep, one for each batch in flight);
    otherwise (a log file, a pipe) it prints plain lines, no carriage returns, at most one per
    batch every `interval` seconds besides the compile, compiled and done lines:

        [  0s] compiling cell nvfp4 (seeds 0-3) ...
        [ 31s] compiled cell nvfp4 in 31s
        [ 41s] nvfp4 (seeds 0-3): step 40/200 loss 3.9124 (0.25 s/step, cell ETA 40s)
        [ 92s] nvfp4 (seeds 0-3): done, loss 3.1021 | sweep 1/4 batches, 4/16 runs, ETA 4m12s

    The sweep's ETA counts the steps left in all batches at the measured seconds per step, plus
    the measured compile time for each cell not yet compiled, spread over `parallel` workers.
    `steps` gives each batch's number of steps, `labels` its name, in the order of the work.
    """

    def __init__(
        self,
        n_cells: int,
        n_runs: int,
        stream=None,
        enabled: bool = True,
        *,
        labels: list[str] | None = None,
        steps: list[int] | None = None,
        compiles: list | None = None,
        parallel: int = 1,
        interval: float = 10.0,
        live: bool | None = None,
    ):
        self.n_cells, self.n_runs = n_cells, n_runs
        self.cells = self.runs = 0
        self.t0 = time.perf_counter()
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.labels = labels or [f"batch {i}" for i in range(n_cells)]
        self.steps = steps or [0] * n_cells
        self.compiles = compiles or list(range(n_cells))  # batches sharing a compiled program
        self.parallel = max(1, parallel)
        self.interval = interval
        self.done_steps = [0] * n_cells
        self.first: dict[int, tuple[float, int]] = {}  # batch -> (time, step) of its 1st report
        self.printed: dict[int, float] = {}
        self.compile_s: list[float] = []
        self.compiled: set = set()
        self.rates: dict[int, float] = {}  # batch -> its measured seconds per step
        self.last = ""
        self.lock = threading.Lock()
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self.live = None
        if enabled and (isatty if live is None else live):
            self.live = _live_display(self.stream)
            self.sweep_task = self.live.add_task("sweep", total=sum(self.steps) or 1, loss="")
            self.tasks: dict[int, Any] = {}
            self.live.start()

    def _say(self, text: str) -> None:
        el = time.perf_counter() - self.t0
        if self.live is not None:
            self.live.console.print(text, highlight=False)
        else:
            self.stream.write(f"[{_dur(el):>5}] {text}\n")
            self.stream.flush()

    def eta(self) -> float:
        """Seconds left: the steps left at the measured seconds per step, plus a measured
        compile for each program not yet compiled, over the parallel workers."""
        left = sum(n - d for n, d in zip(self.steps, self.done_steps, strict=True))
        if not self.rates:
            return math.nan
        rate = sum(self.rates.values()) / len(self.rates)
        uncompiled = len(set(self.compiles) - self.compiled)
        compile_s = sum(self.compile_s) / len(self.compile_s) if self.compile_s else 0.0
        return (left * rate + uncompiled * compile_s) / self.parallel

    def event(self, index: int, event: dict[str, Any]) -> None:
        """One event of batch `index` from `compute_cell` (compile, compiled, step)."""
        if not self.enabled:
            return
        with self.lock:
            kind = event.get("event")
            label = self.labels[index]
            if kind == "compile":
                self._say(f"compiling cell {label} ...")
                self._task(index, f"compiling {label}")
            elif kind == "compiled":
                self.compile_s.append(float(event["seconds"]))
                self.compiled.add(self.compiles[index])
                self._say(f"compiled cell {label} in {_dur(event['seconds'])}")
                self._task(index, label)
            elif kind == "step":
                self._step(index, event)

    def _task(self, index: int, description: str) -> None:
        if self.live is None:
            return
        if index not in self.tasks:
            self.tasks[index] = self.live.add_task(
                description, total=self.steps[index] or None, loss=""
            )
        else:
            self.live.update(self.tasks[index], description=description)

    def _step(self, index: int, event: dict[str, Any]) -> None:
        step, now = int(event["step"]), time.perf_counter()
        if step <= self.done_steps[index]:  # another seed of the same call, same step
            return
        self.compiled.add(self.compiles[index])
        advance = step - self.done_steps[index]
        self.done_steps[index] = step
        if index not in self.first:
            self.first[index] = (now, step)
        t_first, s_first = self.first[index]
        rate = (now - t_first) / (step - s_first) if step > s_first else math.nan
        if math.isfinite(rate):
            self.rates[index] = rate
        loss = event.get("loss")
        self.last = f"loss {loss:.4f}" if loss is not None else self.last
        if self.live is not None:
            self._task(index, self.labels[index])
            self.live.update(self.tasks[index], completed=step, loss=self.last)
            self.live.update(self.sweep_task, advance=advance, loss=self.last)
            return
        if now - self.printed.get(index, -math.inf) < self.interval:
            return
        self.printed[index] = now
        total = self.steps[index] or event.get("steps", 0)
        cell_eta = rate * (total - step) if math.isfinite(rate) else math.nan
        pace = f"{rate:.3g} s/step, " if math.isfinite(rate) else ""
        self._say(
            f"{self.labels[index]}: step {step}/{total} {self.last} "
            f"({pace}cell ETA {_dur(cell_eta)})"
        )

    def update(
        self,
        cells: int = 0,
        runs: int = 0,
        loss: float | None = None,
        note: str = "",
        index: int | None = None,
    ):
        """A batch finished (`cells`=1, its `runs`, its last loss), or just a `note`."""
        if not self.enabled:
            self.cells += cells
            self.runs += runs
            return
        with self.lock:
            self.cells += cells
            self.runs += runs
            if loss is not None:
                self.last = f"loss {loss:.4f}"
            if index is not None:
                left = self.steps[index] - self.done_steps[index]
                self.done_steps[index] = self.steps[index]
                self.compiled.add(self.compiles[index])
                if self.live is not None:
                    self.live.update(self.sweep_task, advance=left)
                    if index in self.tasks:
                        self.live.remove_task(self.tasks.pop(index))
            el = time.perf_counter() - self.t0
            if index is not None and index not in self.rates:  # no step reports: the batch's
                self.rates[index] = el * self.parallel / max(sum(self.done_steps), 1)  # pace
            eta = _dur(self.eta()) if self.cells < self.n_cells else "0s"
            shown = f", loss {loss:.4f}" if loss is not None else ""  # this batch's, if any
            head = f"{self.labels[index]}: {note or 'done'}{shown} | " if index is not None else ""
            tail = f" {note}" if note and index is None else ""
            self._say(
                f"{head}sweep {self.cells}/{self.n_cells} batches, {self.runs}/{self.n_runs} "
                f"runs, {_dur(el)} elapsed, ETA {eta}{tail}"
            )

    def close(self):
        if self.live is not None:
            self.live.stop()
            self.live = None


def _live_display(stream):
    """rich's live progress display on `stream` (a terminal)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[loss]}"),
        console=Console(file=stream),
        refresh_per_second=4,
    )


def _dur(s: float) -> str:
    if not math.isfinite(s):
        return "--"
    s = int(round(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"
