"""Worker processes end with their parent: SIGKILL (a scheduler's timeout) and SIGTERM."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fakes import descendants  # tests/fakes.py

EXPERIMENT = """
from fp4lab.train.config import Config

def get_config():
    return Config(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,),
                  batch_size=32, steps=20000, eval_batches=1, seed_batch=1)

def sweep(add):
    add(lr=1e-3)
    add(lr=2e-3)
"""


def alive(pids: set[int]) -> set[int]:
    out = set()
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(p)
    return out


@pytest.mark.slow  # subprocesses that load jax
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_workers_end_with_their_parent(tmp_path, sig):
    path = tmp_path / "exp.py"
    path.write_text(textwrap.dedent(EXPERIMENT))
    cmd = [sys.executable, "-m", "fp4lab.cli", "run", str(path), "--out", str(tmp_path / "r")]
    cmd += ["--workers", "2", "--quiet", "--no-figures"]
    env = os.environ | {"JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    children: set[int] = set()
    while time.time() < deadline and len(children) < 2:
        assert proc.poll() is None, proc.stderr.read().decode()
        children = descendants(proc.pid)
        time.sleep(0.2)
    assert len(children) >= 2, "the workers did not start"
    time.sleep(1)  # the workers are loading jax or computing (they end with it either way)
    children = descendants(proc.pid)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    if sig == signal.SIGTERM:
        assert proc.returncode == 130 and b"interrupted" in proc.stderr.read()
    deadline = time.time() + 60
    while time.time() < deadline and alive(children):
        time.sleep(0.2)
    assert not alive(children), f"orphaned workers: {alive(children)}"


def worker_signals(config, seeds):
    """A compute that reports, per seed, whether SIGINT is blocked in its worker."""
    return [signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []) for _ in seeds]


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")
def test_workers_start_deaf_to_ctrl_c_and_the_driver_hears_it_again():
    from fp4lab.sweep import executors
    from fp4lab.train.config import Config

    class Cell:
        config = Config(steps=2)

    got = {}
    executors.run_processes(
        [(Cell, [(0, 0, 0)]), (Cell, [(1, 1, 1)])],
        lambda i, results, error: got.__setitem__(i, (results, error)),
        worker_signals,
        workers=2,
    )
    assert got == {0: ([True], None), 1: ([True], None)}  # a Ctrl-C never reaches a worker
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the driver's


@pytest.mark.slow  # subprocesses that load jax
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_ctrl_c_during_the_workers_first_compile_is_one_line(tmp_path):
    path = tmp_path / "exp.py"
    path.write_text(textwrap.dedent(EXPERIMENT))
    cmd = [sys.executable, "-m", "fp4lab.cli", "run", str(path), "--out", str(tmp_path / "r")]
    cmd += ["--workers", "2", "--quiet", "--no-figures"]
    env = os.environ | {"JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(  # its own process group: a terminal's Ctrl-C reaches all of it
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.time() + 120
    while time.time() < deadline and len(descendants(proc.pid)) < 2:
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.2)
    time.sleep(4)  # the workers are loading jax or compiling
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=60)
    err = proc.stderr.read().decode().strip().splitlines()
    assert proc.returncode == 130
    assert err == ["fp4lab run: interrupted; finished runs are stored, run again to resume"], err
