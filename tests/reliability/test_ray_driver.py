"""The Ray executor's driver: an address where no cluster answers is one line within seconds,
not minutes of retries; and after a `kill -9` of the driver, no Ray process it started lives on
(the raylet's agents used to, for a minute)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import fakes  # tests/fakes.py
import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install 'fp4lab[ray]'")

pytestmark = pytest.mark.slow  # subprocesses; the second starts a local Ray instance


def test_an_unreachable_address_is_one_line_within_a_minute(tmp_path, experiment_file):
    path = experiment_file()
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "fp4lab.cli", "run", str(path), "--out", str(tmp_path / "res")]
        + ["--executor", "ray", "--address", "127.0.0.1:1", "--quiet"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert time.monotonic() - t0 < 60
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "cannot reach the Ray cluster at 127.0.0.1:1" in err[0], err


def descendants(pid: int) -> dict[int, str]:
    """{pid: command line} of the live descendants of `pid` (`fakes.descendants`)."""
    return {p: command(p) for p in fakes.descendants(pid)}


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def alive(pids) -> set[int]:
    out = set()
    for p in pids:
        try:
            if Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.add(p)
        except OSError:
            pass
    return out


DRIVER = """
import dataclasses, time
from fp4lab.sweep import ray as ray_executor

@dataclasses.dataclass(frozen=True)
class Config:
    def to_dict(self):
        return {}

@dataclasses.dataclass(frozen=True)
class Cell:
    config: Config = Config()

def compute(config, seeds):
    time.sleep(600)

ray_executor.run([(Cell(), [(0, 0, 0)])], lambda *a: None, compute, num_cpus=1)
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_no_ray_process_outlives_a_killed_driver(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(DRIVER))
    env = os.environ | {"RAY_ADDRESS": "local"}  # a local instance of its own, whatever runs
    driver = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline, seen = time.monotonic() + 120, {}
        while time.monotonic() < deadline and driver.poll() is None:
            seen |= descendants(driver.pid)
            agents = [c for c in seen.values() if "Agent" in c]
            if len(agents) >= 2 and any("ray::attempt" in c for c in seen.values()):
                break  # the agents are up and the task is computing
            time.sleep(0.5)
        assert driver.poll() is None, driver.stderr.read().decode()[-2000:]
        assert any("Agent" in c for c in seen.values()), seen
        seen |= descendants(driver.pid)
    finally:
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
    deadline = time.monotonic() + 10
    while alive(seen) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = {p: seen[p] for p in alive(seen)}
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"alive 10 s after the driver's kill -9: {left}"
