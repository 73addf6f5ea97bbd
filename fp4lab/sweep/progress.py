"""The progress of a sweep as it runs: a live display on a terminal, plain lines elsewhere.

`Progress` takes the runner's events (a batch compiling, a seed's step, a batch done or failed)
and shows the cells, runs and steps done with an estimate of the time left: rich's live display
when the stream is a terminal, else one line per event ("[1m40s] compiled cell ...").

Steps count per seed: a batch of 3 seeds of 60 steps is 180 seed-steps, whether its seeds run
one after the other (the CPU's default) or side by side, and a report says which seed it is
("seed 2/3, step 48/60"). When a batch's last seed has reported its last step, what is left of
it (the evaluation runs, the summaries, writing its records) is shown as a phase of its own.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Any

__all__ = ["FINISHING", "Progress"]

# what a batch does after its last step: held-out evaluation (eval_loss, eval_hp), summaries,
# its records written
FINISHING = "steps done; evaluating, summarizing, writing records"


class Progress:
    """What a sweep shows while it runs, on stderr: compiles, steps inside cells, an ETA.

    Events come from the executors (`start`, `event`, `finish`); step events are the
    reports that `compute_cell` compiles into a cell, every k steps. On a terminal the display
    is a live `rich` progress display (one line for the sweep, one for each batch in flight);
    otherwise (a log file, a pipe) it prints plain lines, no carriage returns, at most one per
    batch every `interval` seconds besides the compile, compiled and done lines:

        [  0s] compiling cell nvfp4 (seeds 0-3) ...
        [ 31s] compiled cell nvfp4 (seeds 0-3) in 31s
        [ 41s] nvfp4 (seeds 0-3): seed 1/4, step 40/200 loss 3.9124 (0.25 s/step, cell ETA
               3m10s, sweep ETA 13m02s)
        [ 92s] nvfp4 (seeds 0-3): steps done; evaluating, summarizing, writing records ...
        [ 93s] nvfp4 (seeds 0-3): done, loss 3.1021 | sweep 1/4 batches, 4/16 runs, ETA 4m12s

    The sweep's ETA counts the seed-steps left in all batches at the measured seconds per
    seed-step, plus, for each program not yet compiled, the first compile's measured time (the
    mean of those measured so far), spread over `parallel` workers. `steps` gives each batch's
    number of steps, `seeds` its seed triples (or their number), `labels` its name, in the order
    of the work.
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
        seeds: list | None = None,
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
        self.per_seed = steps or [0] * n_cells
        self.seeds = [
            [tuple(x) for x in s] if isinstance(s, list | tuple) else [None] * int(s)
            for s in (seeds or [1] * n_cells)
        ]
        self.steps = [n * max(len(s), 1) for n, s in zip(self.per_seed, self.seeds, strict=True)]
        self.seed_steps: dict[int, dict] = {}  # batch -> {seed: its last reported step}
        self.finishing: set[int] = set()  # batches whose every seed reported its last step
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
            self.sweep_task = self.live.add_task(
                "sweep", total=sum(self.steps) or 1, loss="", eta="--"
            )
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
        """Seconds left: the seed-steps left at the measured seconds per seed-step, plus a
        measured compile for each program not yet compiled, over the parallel workers (NaN
        before the first rate is measured)."""
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
                description, total=self.steps[index] or None, loss="", eta="--"
            )
        else:
            self.live.update(self.tasks[index], description=description)

    def _step(self, index: int, event: dict[str, Any]) -> None:
        step, now = int(event["step"]), time.perf_counter()
        seed = tuple(event["seed"]) if event.get("seed") is not None else None
        reached = self.seed_steps.setdefault(index, {})
        if step <= reached.get(seed, 0):  # a repeated report
            return
        self.compiled.add(self.compiles[index])
        reached[seed] = step
        done = sum(reached.values())
        advance = done - self.done_steps[index]
        self.done_steps[index] = done
        if index not in self.first:
            self.first[index] = (now, done)
        t_first, d_first = self.first[index]
        rate = (now - t_first) / (done - d_first) if done > d_first else math.nan
        if math.isfinite(rate):
            self.rates[index] = rate
        loss = event.get("loss")
        self.last = f"loss {loss:.4f}" if loss is not None else self.last
        where = self._where(index, seed, step, event)
        cell_eta = rate * (self.steps[index] - done) if math.isfinite(rate) else math.nan
        finishing = self.steps[index] and done >= self.steps[index]
        if self.live is not None:
            self._task(index, f"{self.labels[index]}: {where}")
            self.live.update(self.tasks[index], completed=done, loss=self.last, eta=_dur(cell_eta))
            self.live.update(self.sweep_task, advance=advance, loss=self.last)
            self.live.update(self.sweep_task, eta=_dur(self.eta()))
        elif now - self.printed.get(index, -math.inf) >= self.interval:
            self.printed[index] = now
            pace = f"{rate:.3g} s/step, " if math.isfinite(rate) else ""
            self._say(
                f"{self.labels[index]}: {where} {self.last} ({pace}cell ETA {_dur(cell_eta)}, "
                f"sweep ETA {_dur(self.eta())})"
            )
        if finishing and index not in self.finishing:
            self.finishing.add(index)
            self._say(f"{self.labels[index]}: {FINISHING} ...")
            self._task(index, f"{self.labels[index]}: {FINISHING}")

    def _where(self, index: int, seed, step: int, event: dict[str, Any]) -> str:
        """ "seed 2/3, step 48/60": which seed of the batch reported, and its step."""
        known = self.seeds[index]
        if seed not in known:  # a seed the batch was not told of: in the order seen
            free = next((i for i, s in enumerate(known) if s is None), None)
            if free is None:
                known.append(seed)
            else:
                known[free] = seed
        total = self.per_seed[index] or event.get("steps", 0)
        return f"seed {known.index(seed) + 1}/{len(known)}, step {step}/{total}"

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
            if self.live is not None:
                self.live.update(self.sweep_task, eta=eta)
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
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps"),
        TimeElapsedColumn(),
        TextColumn("ETA {task.fields[eta]}"),
        TextColumn("{task.fields[loss]}"),
        console=Console(file=stream),
        refresh_per_second=4,
    )


def _dur(s: float) -> str:
    if not math.isfinite(s):
        return "--"
    s = int(round(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"
