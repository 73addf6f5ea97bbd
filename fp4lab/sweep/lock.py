"""One writer per results folder: an advisory lock that `run_experiment` holds while it writes.

Two sweeps writing one folder would each rewrite `experiment.json` with their own cells, and
the runs of the first would turn stale under it. So a sweep takes an exclusive `flock` on
`<out>/.writer.lock` before it reads what is left to do, and keeps it until it returns; a second
sweep into the same folder stops at once with one line naming the holder (process id, host,
start time), which the holder writes into the lock file.

The lock belongs to the open file, so it ends with its process, however that ends (a `kill
-9` included): a lock file left by a dead sweep never blocks the next one. The file itself
stays (deleting it would let two writers lock two different files). Readers (`load`, `ls`,
`show`, `report`) take no lock: every file is replaced atomically, so they see whole files.
`flock` is advisory and per host on some network filesystems (NFS before Linux 2.6.12 locks
only locally): two hosts writing one shared folder must not rely on it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from fp4lab.sweep.records import StoreError

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock (one writer is then the user's rule)
    fcntl = None

__all__ = ["LOCK_FILE", "FolderBusy", "writer"]

LOCK_FILE = ".writer.lock"


class FolderBusy(StoreError):
    """Another live process is writing the results folder."""


@contextlib.contextmanager
def writer(folder: str | os.PathLike) -> Iterator[Path]:
    """Holds the folder's writer lock for the duration of the `with` block (yields the lock
    file's path); the folder is created if needed.

    Raises:
      FolderBusy: another process holds it; the message names that process.
      StoreError: the lock file cannot be created (a read-only folder, a full disk).
    """
    folder = Path(folder)
    path = folder / LOCK_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as e:
        why = "no space left on the device" if e.errno == errno.ENOSPC else e.strerror or str(e)
        raise StoreError(f"{path}: cannot write the results folder: {why}") from e
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise FolderBusy(
                    f"{folder} is being written by another fp4lab run ({_holder(path)}); one "
                    "writer per results folder: wait for it to end, or choose another --out"
                ) from None
        with contextlib.suppress(OSError):  # who holds it, for the message of a second writer
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            os.ftruncate(fd, 0)
            line = f"process {os.getpid()} on {socket.gethostname()} since {stamp}\n"
            os.pwrite(fd, line.encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock


def _holder(path: Path) -> str:
    """The holder's line from the lock file ("process 123 on host since ..."); it writes it just
    after taking the lock, so an empty file is read again for a moment."""
    for _ in range(20):
        with contextlib.suppress(OSError):
            text = path.read_text().strip()
            if text:
                return text
        time.sleep(0.05)
    return "process unknown"
