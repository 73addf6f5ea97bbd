"""`fp4lab run` stopped by SIGTERM while XLA compiles a cell in the process (--workers 1)
exits with its interrupt line and code 130, not a segmentation fault in the interpreter's
finalization under XLA's threads, and the folder resumes."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from fp4lab import cli

# a small LM: the signal comes at a point XLA logs in the cell's compile, whatever its size
EXPERIMENT = """
from fp4lab.train.config import Config

def get_config():
    return Config(d_model=16, n_heads=2, n_layers=1, d_ff=32, seq_len=8, batch_size=4,
                  vocab=16, steps=5, eval_batches=1, seed_batch=2, recipe="nvfp4")

def sweep(add):
    add("a", seeds=2)
"""
# XLA logs the end of its HLO passes on the cell's program; its code generation follows
XLA_LOG = {"TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "cpu_compiler=1"}
IN_COMPILE = b"Running HLO passes on [jit_train]"
CACHES = ("JAX_COMPILATION_CACHE_DIR", "FP4LAB_PROGRAM_CACHE")


def test_sigterm_during_a_compile_exits_130_and_the_folder_resumes(tmp_path):
    path, out = tmp_path / "tiny.py", tmp_path / "out"
    path.write_text(textwrap.dedent(EXPERIMENT))
    argv = ["run", str(path), "--out", str(out), "--workers", "1", "--no-compile-cache"]
    # no compiled program from the test session's caches: this process compiles its own
    env = {k: v for k, v in os.environ.items() if k not in CACHES} | {"JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fp4lab.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env | XLA_LOG,
    )
    seen = b""
    for line in iter(proc.stderr.readline, b""):
        seen += line
        if IN_COMPILE in line:
            proc.send_signal(signal.SIGTERM)
            break
    _, err = proc.communicate(timeout=300)
    code, err = proc.returncode, (seen + err).decode(errors="replace")
    assert IN_COMPILE.decode() in err  # the signal came inside XLA's compile
    assert "Fatal Python error" not in err and code != -signal.SIGSEGV, err[-2000:]
    assert code == 130, err[-2000:]
    assert "interrupted; finished runs are stored, run again to resume" in err
    assert cli.main([*argv, "--quiet"]) == 0  # the folder resumes (here: no second jax import)
    assert len(list((out / "runs").glob("*.json"))) == 2


LOST = """
import signal, time
from fp4lab.cli import terminate_as_interrupt

# Ctrl-C as an interactive Python gets it, however the test command was started (a shell
# starts a background job with SIGINT ignored, and Python then leaves it ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)

class SlowToCollect:
    def __del__(self):
        print("collecting", flush=True)
        time.sleep(5)  # SIGTERM comes here: its KeyboardInterrupt is one Python ignores

terminate_as_interrupt()
try:
    obj = SlowToCollect()
    del obj
    time.sleep(5)
    print("went on to the end", flush=True)
except KeyboardInterrupt as e:
    print("stopped by", e, flush=True)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupt_lost_in_a_finalizer_is_delivered_again(signum):
    proc = subprocess.Popen(
        [sys.executable, "-c", LOST], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout.readline() == b"collecting\n"
    proc.send_signal(signum)  # SIGINT: a Ctrl-C (jax's _xla_gc_callback, during a compile)
    out, err = proc.communicate(timeout=60)
    said = "signal 15" if signum == signal.SIGTERM else ""
    assert out.decode() == f"stopped by {said}\n", (out, err)
    assert b"Exception ignored" not in err, err
