"""XLA's slow-operation banners on stderr as one plain line each (`fp4lab run`).

XLA's C++ code writes its slow-compile alarms straight to file descriptor 2, and has no flag to
turn them off:

    E1130 22:05:20.707171    8946 slow_operation_alarm.cc:140] The operation took 2m4.822801578s

    ********************************
    [Compiling module jit_train for CPU] Very slow compile? If you want to file a bug, ...
    ********************************

`filter_stderr()` routes fd 2 through a pipe while its block runs: a filter process reads the
pipe in chunks and writes everything to the original stderr, except such a banner, which
becomes one line:

    XLA: compiling jit_train took 2m4.8s               the banner when the compile has ended
    XLA: compiling jit_train is taking a while         the alarm while it still compiles
    XLA: constant folding %add.5 took 1.1s             the constant-folding variants
    XLA: constant folding %add.5 is taking > 1s

Both log formats are recognized: absl's (`E1130 22:05:20.707171  8946 file.cc:140] `) and the
older TensorFlow one (`2025-03-19 07:30:02.045318: E external/.../file.cc:73] `). Any other
text passes unchanged and in order, partial lines (a progress bar's carriage returns) at once:
only text that could still become a banner is held back, a line that begins like an XLA log
line from slow_operation_alarm.cc and the lines that follow it, and no longer than
`HOLD_SECONDS` without new input (then it passes verbatim; so does a banner of a shape not
listed above). Child processes inherit fd 2, so their output is filtered too.

Python's own `sys.stderr` writes go through the same pipe, so lines keep their order; while
the block runs `sys.stderr` is a stream that writes to fd 2 but answers `isatty()` for the
original stderr, so a terminal stays a terminal (live progress displays, colours).

The filter runs in a process of its own (`serve`, started with this interpreter: a block that
writes nothing costs about 40 ms), so a crash of this one (a segfault, an XLA check failure that
aborts, kill -9) loses nothing written before it: the filter reads the pipe to its end and
exits (tested with an abort). Python's faulthandler, if enabled, is pointed at the original
stderr while the block runs. This module imports nothing else from fp4lab (standard library
only) and does nothing on a system without `select` on pipes (Windows).
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import os
import re
import secrets
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal

__all__ = ["HOLD_SECONDS", "BannerFilter", "filter_stderr", "serve"]

HOLD_SECONDS = 0.5  # the longest text that may begin a banner is held without new input

_FILE = rb"(?:\S*/)?slow_operation_alarm\.cc:\d+\]"
_HEADER = re.compile(
    rb"(?:[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ |\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] )"
    + _FILE
    + rb" ?"
)
# the log prefix before the file name, in its two formats (absl, TensorFlow)
_STEMS = (
    re.compile(rb"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ "),
    re.compile(rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] "),
)


def _prefix_pattern(atoms: list[str]) -> re.Pattern:
    """A pattern whose full matches are the non-empty beginnings of the atoms' sequence."""
    pattern = ""
    for atom in reversed(atoms):
        pattern = atom + (f"(?:{pattern})?" if pattern else "")
    return re.compile(pattern.encode())


_D = r"\d"
_STEM_STARTS = (
    _prefix_pattern(
        ["[IWEF]", *[_D] * 4, " ", _D, _D, ":", _D, _D, ":", _D, _D, r"\.", r"\d+"] + [" +", r"\d+"]
    ),
    _prefix_pattern(
        [*[_D] * 4, "-", _D, _D, "-", _D, _D, " ", _D, _D, ":", _D, _D, ":", _D, _D]
        + [r"\.", r"\d+", ":", " ", "[IWEF]"]
    ),
)
_FILE_START = _prefix_pattern([*map(re.escape, "slow_operation_alarm.cc:"), r"\d+", r"\]"])


def _could_begin_banner(text: bytes) -> bool:
    """Whether `text`, the beginning of a line without its end, could become a banner's first
    line: a log prefix so far, then a file name that could still become
    `slow_operation_alarm.cc:LINE]` (absl's base name) or `.../slow_operation_alarm.cc:LINE]`
    (TensorFlow's path: any one word could, until a blank)."""
    if _HEADER.match(text):
        return True
    for stem, paths in zip(_STEMS, (False, True), strict=True):
        m = stem.match(text)
        if m:
            name = text[m.end() :]
            if not name:
                return True
            if name[-1:].isspace() or len(name.split()) != 1:
                return False
            return paths or b"/" in name or bool(_FILE_START.fullmatch(name))
    return any(p.fullmatch(text) for p in _STEM_STARTS)


_STARS = re.compile(r"\*{8,}\s*")
_COMPILE = re.compile(r"(?:\[(?P<context>[^\]]*)\] )?(?:Very slow|Slow) compile\?.*")
_FOLDING = re.compile(r"Constant folding an instruction (?P<taking>is taking > \S+?):?\s*")
_INSTRUCTION = re.compile(r"\s*(?P<name>%\S+) = ")
_TOOK = re.compile(r"(?:\[[^\]]*\] )?The operation took (?P<took>\S+)\s*")
_MAX_LINES = 64
_MAX_BYTES = 1 << 20


def _duration(text: str) -> str:
    """absl's duration text (`2m4.822801578s`, `1h2m`, `850ms`) to one decimal of seconds
    (`2m4.8s`); text of another shape unchanged."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|ns|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return text
    scale = {"h": 36000, "m": 600, "s": 10, "ms": "0.01", "us": "0.00001", "ns": "0.00000001"}
    exact = sum(Decimal(n) * Decimal(scale[u]) for n, u in parts)  # in tenths of a second
    tenths = int(exact.to_integral_value(ROUND_HALF_UP))
    hours, tenths = divmod(tenths, 36000)
    minutes, tenths = divmod(tenths, 600)
    seconds = f"{tenths // 10}.{tenths % 10}s"
    if hours:
        return f"{hours}h{minutes}m{seconds}"
    return f"{minutes}m{seconds}" if minutes else seconds


def _summarize(lines: list[bytes]) -> tuple[str, bytes]:
    """What the complete lines `lines` (the first a slow_operation_alarm.cc log line) are:
    ("more", b"") a banner's beginning, ("done", its one line) a whole banner, or ("no", b"")
    no banner of a known shape."""
    text = [line.decode("utf-8", "replace").rstrip("\r\n") for line in lines]
    head = _HEADER.match(lines[0])
    if head is None:
        return "no", b""
    message = lines[0][head.end() :].decode("utf-8", "replace").rstrip("\r\n")
    took = _TOOK.fullmatch(message)
    body = text[1:] if took or not message.strip() else [message, *text[1:]]
    blank = 0
    while blank < len(body) and not body[blank].strip():
        blank += 1
    if blank > 2:
        return "no", b""
    body = body[blank:]
    if not body:
        return "more", b""
    if len(lines) > 1 and any(stem.match(lines[-1]) for stem in _STEMS):
        return "no", b""  # another log line began: whatever was held is no known banner
    took_s = _duration(took["took"]) if took else None
    if _STARS.fullmatch(body[0]):  # a compile alarm: stars, [context] Very slow compile?, stars
        if len(body) > 1 and not _COMPILE.fullmatch(body[1]):
            return "no", b""
        if len(body) > 2 and not _STARS.fullmatch(body[2]):
            return "no", b""
        if len(body) < 3:
            return "more", b""
        context = _COMPILE.fullmatch(body[1])["context"] or ""
        module = re.fullmatch(r"Compiling module (\S+?)(?: for .*)?", context)
        what = module[1] if module else context or "a program"
        line = f"compiling {what} " + (f"took {took_s}" if took else "is taking a while")
    elif folding := _FOLDING.fullmatch(body[0]):  # ... until "If you'd like to file a bug"
        if not body[-1].startswith("If you'd like to file a bug"):
            return "more", b""
        name = next((m["name"] for m in map(_INSTRUCTION.match, body) if m), "an instruction")
        line = f"constant folding {name} " + (f"took {took_s}" if took else folding["taking"])
    else:
        return "no", b""
    return "done", f"XLA: {line}\n".encode()


class BannerFilter:
    """The filter's logic on bytes, with no file descriptors: `feed(data)` returns what may be
    written now, `flush()` what it still holds (verbatim); `holding` whether it holds any."""

    def __init__(self) -> None:
        self._at_line_start = True  # the output so far ends with a newline (or is empty)
        self._partial = b""  # the held beginning of a line that could begin a banner
        self._banner: list[bytes] | None = None  # complete lines of a banner in progress

    @property
    def holding(self) -> bool:
        return bool(self._partial) or self._banner is not None

    def feed(self, data: bytes) -> bytes:
        out = []
        data, self._partial = self._partial + data, b""
        while data:
            end = data.find(b"\n")
            if not self._at_line_start and self._banner is None:  # the rest of a passed line
                if end < 0:
                    out.append(data)
                    break
                out.append(data[: end + 1])
                data, self._at_line_start = data[end + 1 :], True
                continue
            if end < 0:  # a line's beginning
                if self._banner is not None or _could_begin_banner(data):
                    self._partial = data
                else:
                    out.append(data)
                    self._at_line_start = False
                break
            out.append(self._line(data[: end + 1]))
            data = data[end + 1 :]
        return b"".join(out)

    def flush(self) -> bytes:
        held = b"".join(self._banner or []) + self._partial
        if self._partial:
            self._at_line_start = False
        self._banner, self._partial = None, b""
        return held

    def _line(self, line: bytes) -> bytes:
        """One complete line that begins at a line start: what to write now."""
        if self._banner is None:
            if not _HEADER.match(line):
                return line
            self._banner = []
        self._banner.append(line)
        lines = self._banner
        verdict, summary = _summarize(lines)
        if verdict == "more" and (len(lines) > _MAX_LINES or sum(map(len, lines)) > _MAX_BYTES):
            verdict = "no"
        if verdict == "more":
            return b""
        self._banner = None
        if verdict == "done":
            return summary
        if len(lines) == 1:
            return lines[0]
        return b"".join(lines[:-1]) + self._line(lines[-1])  # the last may begin a banner


class _Pump:
    """The filter process's loop: reads the pipe (`read`), filters, writes to the original
    stderr (`out`). The sentinel, written last by `filter_stderr`, marks everything before it
    passed on: the pump then writes a byte to `ack`."""

    def __init__(self, read: int, out: int, ack: int, sentinel: bytes) -> None:
        self.read, self.out, self.ack, self.sentinel = read, out, ack, sentinel
        self.filter = BannerFilter()
        self.broken = False  # the original stderr is gone: keep reading, write nothing
        self.carry = b""  # a chunk's end that could be the beginning of the sentinel

    def _write(self, data: bytes) -> None:
        while data and not self.broken:
            try:
                data = data[os.write(self.out, data) :]
            except BlockingIOError:  # a terminal another program made non-blocking
                ready = select.poll()
                ready.register(self.out, select.POLLOUT)
                ready.poll(1000)
            except OSError:
                self.broken = True

    def _acknowledge(self) -> None:
        if self.ack >= 0:
            with contextlib.suppress(OSError):
                os.write(self.ack, b"1")
                os.close(self.ack)
            self.ack = -1

    def run(self) -> None:
        try:
            self._filtered()
        except Exception:  # a bug here must not block the writers: pass the rest on as is
            self._write(self.filter.flush())
            self._unfiltered()
        finally:
            self._acknowledge()

    def _filtered(self) -> None:
        poll = select.poll()
        poll.register(self.read, select.POLLIN)
        while True:
            if (self.carry or self.filter.holding) and not poll.poll(HOLD_SECONDS * 1000):
                self._write(self.filter.feed(self.carry) + self.filter.flush())
                self.carry = b""
                continue
            chunk = os.read(self.read, 1 << 16)
            if not chunk:
                break
            data, self.carry = self.carry + chunk, b""
            at = data.find(self.sentinel)
            if at >= 0:
                self._write(self.filter.feed(data[:at]) + self.filter.flush())
                self._acknowledge()
                data = data[at + len(self.sentinel) :]
            else:
                keep = self._sentinel_start(data)
                data, self.carry = data[: len(data) - keep], data[len(data) - keep :]
            self._write(self.filter.feed(data))
        self._write(self.filter.feed(self.carry) + self.filter.flush())

    def _unfiltered(self) -> None:
        data = self.carry
        with contextlib.suppress(OSError):
            while chunk := os.read(self.read, 1 << 16):
                data += chunk
                if self.sentinel in data:
                    data = data.replace(self.sentinel, b"")
                    self._write(data)
                    self._acknowledge()
                    data = b""
                else:
                    keep = self._sentinel_start(data)
                    self._write(data[: len(data) - keep])
                    data = data[len(data) - keep :]
        self._write(data)

    def _sentinel_start(self, data: bytes) -> int:
        """The length of the longest end of `data` that begins the sentinel."""
        for n in range(min(len(data), len(self.sentinel) - 1), 0, -1):
            if self.sentinel.startswith(data[-n:]):
                return n
        return 0


class _Fd2(io.RawIOBase):
    """The raw stream under `sys.stderr` while the filter runs: writes go to fd 2 (the pipe),
    `isatty()` answers for `tty` (the original stderr, fd 2 again once the block ends)."""

    def __init__(self, tty: int) -> None:
        super().__init__()
        self.tty = tty

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return 2

    def isatty(self) -> bool:
        return os.isatty(self.tty)

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.write(2, view[done:])
        return done


def _writes_to_fd2(stream) -> bool:
    try:
        return stream is not None and stream.fileno() == 2
    except (AttributeError, OSError, ValueError):
        return False


@contextlib.contextmanager
def filter_stderr() -> Iterator[None]:
    """Routes file descriptor 2 through the filter of XLA's slow-operation banners while the
    block runs (module docstring). On leaving, normally or by an exception, fd 2 is restored
    and everything written before is passed on first. The filter is a process of its own, so
    a crash of this one (an abort, a segfault, kill -9) loses nothing written before it: the
    filter reads the pipe to its end. Output of a process started inside that outlives the
    block (a multiprocessing resource tracker) is still passed on while it lives."""
    if os.name != "posix":
        yield
        return
    for stream in (sys.stderr, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        original = os.dup(2)
    except OSError:  # no stderr to filter
        yield
        return
    read, write = os.pipe()
    ack_read, ack_write = os.pipe()
    sentinel = "fp4lab-stderr-filter-" + secrets.token_hex(8)
    try:
        pump = subprocess.Popen(
            [sys.executable, "-c", _SERVE, str(original), str(ack_write), sentinel],
            stdin=read,
            stdout=subprocess.DEVNULL,
            stderr=original,
            pass_fds=(original, ack_write),
            start_new_session=True,  # a Ctrl-C of the terminal stops the run, not its output
        )
    except OSError:  # no process to filter with: stderr as it is
        for fd in (read, write, ack_read, ack_write, original):
            os.close(fd)
        yield
        return
    _PUMPS.append(pump)
    os.close(read)
    os.close(ack_write)
    os.dup2(write, 2)  # C code here and every child process started from now write to the pipe
    python_stderr, ours = sys.stderr, None
    try:
        if _writes_to_fd2(python_stderr):  # through the pipe too, so that lines keep their order
            ours = io.TextIOWrapper(
                _Fd2(original),
                encoding=python_stderr.encoding,
                errors=python_stderr.errors,
                line_buffering=True,
                write_through=True,
            )
            sys.stderr = ours
            if faulthandler.is_enabled():  # a crash's dump goes around the pipe
                faulthandler.enable(file=original)
        yield
    finally:
        if ours is not None:
            with contextlib.suppress(Exception):
                ours.flush()
            ours.buffer.tty = 2  # a stream kept from the block writes to stderr as before
            if sys.stderr is ours:
                sys.stderr = python_stderr
            if faulthandler.is_enabled():
                faulthandler.enable(file=python_stderr)
        os.dup2(original, 2)
        try:
            os.write(write, _framed(sentinel))  # after everything written before
        finally:
            os.close(write)
        # the filter answers once it has passed everything before the sentinel on (or exits)
        with contextlib.suppress(OSError):
            select.select([ack_read], [], [], _ACK_SECONDS)
        os.close(ack_read)
        os.close(original)
        with contextlib.suppress(subprocess.TimeoutExpired):
            pump.wait(0.2)  # it ends with the pipe, unless another process still holds it
        if pump.poll() is not None:
            _PUMPS.remove(pump)


_ACK_SECONDS = 30.0  # the longest wait for the filter to pass the block's output on
_PUMPS: list = []  # filter processes that outlive their block (a process holds the pipe)
_SERVE = (
    "import sys; from fp4lab.stderr_filter import serve; "
    "serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])"
)


def _framed(sentinel: str) -> bytes:
    """The sentinel as it travels through the pipe: NUL-framed, so no text line matches it."""
    return b"\0" + sentinel.encode() + b"\0"


def serve(out: int, ack: int, sentinel: str) -> None:
    """The filter process: stdin (the pipe) filtered to `out` until the pipe's end; a byte on
    `ack` once the sentinel has come and everything before it is passed on."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _Pump(0, out, ack, _framed(sentinel)).run()
