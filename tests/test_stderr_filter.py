"""`fp4lab run`'s stderr filter: XLA's slow-operation banners become one line each, everything
else passes in order (partial lines at once), from this process and from its children, and
nothing is lost on an exception. Fast: the child processes import no jax."""

import os
import pty
import select
import subprocess
import sys
import time

import pytest

from fp4lab import cli
from fp4lab.stderr_filter import HOLD_SECONDS, BannerFilter

STARS = "*" * 32
ADVICE = (
    "Very slow compile? If you want to file a bug, run with envvar "
    "XLA_FLAGS=--xla_dump_to=/tmp/foo and attach the results."
)
# the alarm while a compile still runs (slow_operation_alarm.cc:65, no time)
ALARM = (
    "E1130 22:03:16.001234    8946 slow_operation_alarm.cc:65] \n"
    f"{STARS}\n[Compiling module jit_train for CPU] {ADVICE}\n{STARS}\n"
)
# the banner once the compile has ended (slow_operation_alarm.cc:140)
TOOK = (
    "E1130 22:05:20.707171    8946 slow_operation_alarm.cc:140] The operation took "
    f"2m4.822801578s\n\n{STARS}\n[Compiling module jit_train for CPU] {ADVICE}\n{STARS}\n"
)
# the older TensorFlow log prefix, the module without a platform, XLA's two spaces
TOOK_TF = (
    "2025-03-19 07:30:14.895694: E external/xla/xla/service/slow_operation_alarm.cc:140] The "
    f"operation took 1h0m12.85s\n\n{STARS}\n[Compiling module reactant_loop_] Very slow "
    f"compile?  If you want to file a bug, run with envvar XLA_FLAGS=--xla_dump_to=/tmp/foo "
    f"and attach the results.\n{STARS}\n"
)
FOLDING_TEXT = (
    "Constant folding an instruction is taking > 2s:\n\n"
    "  %add.2638 = f32[4,199600,3]{2,1,0} add(f32[4,199600,3]{2,1,0} %constant.116, "
    'f32[4,199600,3]{2,1,0} %broadcast.2637), metadata={op_type="AddV2"}\n\n'
    "This isn't necessarily a bug; constant-folding is inherently a trade-off between "
    "compilation time and speed at runtime. XLA has some guards that attempt to keep constant "
    "folding from taking too long, but fundamentally you'll always be able to come up with an "
    "input program that takes a long time.\n\n"
    "If you'd like to file a bug, run with envvar XLA_FLAGS=--xla_dump_to=/tmp/foo and attach "
    "the results.\n"
)
FOLDING = "E0331 17:20:26.540595   77 slow_operation_alarm.cc:65] " + FOLDING_TEXT
FOLDING_TOOK = (
    "E0331 17:20:27.612345   77 slow_operation_alarm.cc:133] The operation took 3.0721s\n"
    + FOLDING_TEXT
)
SUMMARIES = {
    ALARM: "XLA: compiling jit_train is taking a while\n",
    TOOK: "XLA: compiling jit_train took 2m4.8s\n",
    TOOK_TF: "XLA: compiling reactant_loop_ took 1h0m12.9s\n",
    FOLDING: "XLA: constant folding %add.2638 is taking > 2s\n",
    FOLDING_TOOK: "XLA: constant folding %add.2638 took 3.1s\n",
}


def run_filter(chunks: list[str]) -> str:
    f = BannerFilter()
    return "".join(f.feed(c.encode()).decode() for c in chunks) + f.flush().decode()


@pytest.mark.parametrize("banner", list(SUMMARIES), ids=list(map(repr, SUMMARIES.values())))
def test_each_banner_becomes_its_one_line_however_it_is_split(banner):
    text = f"before\n{banner}after\n"
    expected = f"before\n{SUMMARIES[banner]}after\n"
    assert run_filter([text]) == expected
    assert run_filter(list(text)) == expected  # byte by byte
    lines = text.splitlines(keepends=True)
    assert run_filter(lines) == expected


def test_ordinary_text_passes_unchanged_and_partial_lines_at_once():
    f = BannerFilter()
    assert f.feed(b"progress 10%\r") == b"progress 10%\r"  # no newline needed
    assert f.feed(b"progress 100%\n") == b"progress 100%\n"
    ordinary = [
        f"{STARS}\n",  # stars without the log line before them
        "note: **** not a banner ****\n",
        "[Compiling module jit_x for CPU] printed by someone else\n",
        "E1130 22:05:20.707171    8946 cpu_compiler.cc:12] another XLA error, kept\n",
        "W0000 00:00:00.000000   1 slow_operation_alarm.cc:99] an alarm of another shape\n",
        "Epoch 1\n",
    ]
    for line in ordinary:
        assert run_filter([line]) == line
        assert run_filter(list(line)) == line
    assert f.feed(b"E") == b"" and f.holding  # could begin a log line: held ...
    assert f.feed(b"poch 2") == b"Epoch 2" and not f.holding  # ... until it cannot
    assert f.feed(b"\nE1130 22:0") == b"\n" and f.flush() == b"E1130 22:0"


def test_a_banner_cut_short_by_another_log_line_passes_verbatim():
    cut = ALARM.splitlines(keepends=True)[:2]
    text = "".join(cut) + TOOK
    assert run_filter([text]) == "".join(cut) + SUMMARIES[TOOK]
    assert run_filter(list(text)) == "".join(cut) + SUMMARIES[TOOK]


CHILD = """
import os, subprocess, sys
from fp4lab.stderr_filter import filter_stderr

BANNERS = {banners!r}
with filter_stderr():
    os.write(2, b"line 1\\n")
    os.write(2, BANNERS[0].encode())
    print("line 2 from python", file=sys.stderr)
    os.write(2, b"progress 10%\\r")
    os.write(2, b"progress 100%\\n")
    os.write(2, b"note: **** ordinary stars ****\\n")
    os.write(2, BANNERS[1].encode())
    code = "import os, sys; os.write(2, sys.argv[1].encode()); os.write(2, b'grandchild\\\\n')"
    subprocess.run([sys.executable, "-c", code, BANNERS[2]], check=True)
    os.write(2, b"line 3\\n")
    os.write(2, b"a partial last line")
    raise RuntimeError("boom after the banners")
"""


def test_a_child_process_and_its_grandchild_are_filtered_and_nothing_is_lost(tmp_path):
    banners = [ALARM, TOOK, FOLDING_TOOK]
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(banners=banners))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=60)
    assert result.returncode == 1
    err = result.stderr.decode()  # not text=True: it would turn the "\r" into "\n"
    before, traceback = err.split("Traceback (most recent call last):\n")
    assert before == (
        "line 1\n"
        + SUMMARIES[ALARM]
        + "line 2 from python\n"
        + "progress 10%\rprogress 100%\n"
        + "note: **** ordinary stars ****\n"
        + SUMMARIES[TOOK]
        + SUMMARIES[FOLDING_TOOK]
        + "grandchild\n"
        + "line 3\n"
        + "a partial last line"
    )
    assert traceback.rstrip().endswith("RuntimeError: boom after the banners")


PROMPT = """
import os, sys
from fp4lab.stderr_filter import filter_stderr

with filter_stderr():
    print("tty:", sys.stderr.isatty(), flush=True)
    os.write(2, b"50% done\\r")
    sys.stdin.readline()  # the parent answers once it has read the partial line
    os.write(2, b"100% done\\nE1130 22:05")  # could begin a banner: held a while
    sys.stdin.readline()
    os.write(2, b"\\n")
print("tty after:", sys.stderr.isatty(), flush=True)
"""


def read_until(fd: int, text: bytes, seen: bytes = b"", timeout: float = 30) -> bytes:
    deadline = time.monotonic() + timeout
    while text not in seen and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.05)[0]:
            seen += os.read(fd, 1024)
    return seen


def test_a_partial_line_passes_at_once_and_a_terminal_stays_a_terminal():
    primary, secondary = pty.openpty()  # the child's stderr is a terminal
    child = subprocess.Popen(
        [sys.executable, "-c", PROMPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=secondary,
    )
    os.close(secondary)
    try:
        seen = read_until(primary, b"50% done\r")
        assert seen.endswith(b"50% done\r")  # before the child writes anything more
        child.stdin.write(b"\n")
        child.stdin.flush()
        t0 = time.monotonic()
        seen = read_until(primary, b"E1130 22:05", seen)
        waited = time.monotonic() - t0
        assert seen.endswith(b"100% done\r\nE1130 22:05")  # the terminal writes \r\n
        assert HOLD_SECONDS * 0.9 < waited < HOLD_SECONDS + 10
        out, _ = child.communicate(b"\n", timeout=30)
    finally:
        child.kill()
        os.close(primary)
    assert out.decode().split() == ["tty:", "True", "tty", "after:", "True"]


def test_run_accepts_xla_log(capsys):
    args = cli.build_parser().parse_args(["run", "exp.py", "--xla-log"])
    assert args.xla_log is True
    assert cli.build_parser().parse_args(["run", "exp.py"]).xla_log is False
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--xla-log show XLA's own log lines unfiltered" in text


ABORT = """
import os, sys
from fp4lab.stderr_filter import filter_stderr

BANNER = {banner!r}
with filter_stderr():
    os.write(2, b"before the banner\\n")
    os.write(2, BANNER.encode())
    print("the last words from python", file=sys.stderr)
    os.write(2, b"E1130 22:05")  # held: it could begin a banner
    os.abort()
"""


def test_a_process_that_aborts_loses_nothing_it_wrote(tmp_path):
    # the filter is a process of its own: the crash closes the pipe, the filter reads it to
    # its end, passes everything on (the held beginning verbatim) and exits
    script = tmp_path / "abort.py"
    script.write_text(ABORT.format(banner=TOOK))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=60)
    assert result.returncode < 0  # killed by SIGABRT
    assert result.stderr.decode() == (
        "before the banner\n" + SUMMARIES[TOOK] + "the last words from python\n" + "E1130 22:05"
    )
