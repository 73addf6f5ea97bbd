"""A watchdog that ends the processes a driver started when the driver dies without cleaning up.

A local Ray instance started by `ray.init()` mostly dies with its driver (Ray asks the kernel to
kill its GCS server and raylet when the driver dies), but the raylet's agents
(`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) outlive a `kill -9` of the driver by a minute
or more: they notice the raylet's death, then wait up to 60 s to report it to a GCS server that
is gone. `watch()` starts this file as a small separate process (standard library only, not
imported as part of fp4lab) that, twice a second, notes the driver's descendants. When the
driver dies (its end of a pipe closes without a goodbye), it SIGKILLs every process it saw
descend from the driver that is still alive (the same process: its start time is checked, so
a reused process id is never hit), and their children. `Watchdog.close()` says goodbye: the
watchdog then exits and kills nothing.

Needs Linux's /proc; elsewhere `watch()` returns a watchdog that does nothing.

    python reaper.py DRIVER_PID      # what watch() runs; stdin is the pipe from the driver
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["Watchdog", "watch"]

_PERIOD_S = 0.5
_BYE = b"bye\n"


class Watchdog:
    """The driver's handle on its watchdog process (None: no watchdog on this system)."""

    def __init__(self, process: subprocess.Popen | None):
        self.process = process

    def close(self) -> None:
        """The driver cleaned up: the watchdog exits without killing anything."""
        if self.process is None:
            return
        try:
            self.process.stdin.write(_BYE)
            self.process.stdin.close()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        self.process = None


def watch() -> Watchdog:
    """Starts a watchdog for this process (see the module docstring)."""
    if not Path("/proc/self/stat").exists():
        return Watchdog(None)
    process = subprocess.Popen(
        [sys.executable, "-S", "-E", __file__, str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not in the driver's process group: a Ctrl-C spares it
        close_fds=True,
    )
    return Watchdog(process)


def _table() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, start time)} of every live (non-zombie) process, from /proc."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X"):
            out[int(d.name)] = (int(fields[1]), int(fields[19]))
    return out


def _descendants(roots: set[int], table: dict[int, tuple[int, int]]) -> set[int]:
    out, frontier = set(), set(roots)
    while frontier:
        frontier = {p for p, (parent, _) in table.items() if parent in frontier} - out
        out |= frontier
    return out


def _main(driver: int) -> None:
    me = os.getpid()
    seen: dict[int, int] = {}  # pid -> start time, of every process seen below the driver
    while True:
        ready, _, _ = select.select([sys.stdin.buffer], [], [], _PERIOD_S)
        if ready:
            data = os.read(sys.stdin.fileno(), 64)
            if data.startswith(_BYE):
                return
            if not data:  # the driver is gone and said nothing
                break
        table = _table()
        seen = {p: t for p, t in seen.items() if table.get(p, (0, -1))[1] == t}
        seen |= {p: table[p][1] for p in _descendants({driver}, table) if p != me}
    table = _table()
    alive = {p for p, t in seen.items() if table.get(p, (0, -1))[1] == t}
    for p in alive | _descendants(alive, table):
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    _main(int(sys.argv[1]))
