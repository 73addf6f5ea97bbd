"""jax's persistent compilation cache and the stored programs: later processes load the traced
program and its executable, results unchanged."""

import pickle
import subprocess
import sys

import numpy as np
import pytest

SCRIPT = """
import os, pickle, sys
os.environ["JAX_PLATFORMS"] = "cpu"
from fp4lab import sweep
from fp4lab.sweep.compute import use_compile_cache
from fp4lab.train import Config
if sys.argv[1] != "off":
    use_compile_cache(sys.argv[1], min_compile_seconds=0, programs=True)
cfg = Config(task="teacher", din=16, dout=16, teacher_hidden=(16,), hidden=(32,), batch_size=16,
             steps=6, recipe="nvfp4", telemetry_every=3, eval_batches=1)
out = sweep.compute_cell(cfg.to_dict(), [(0, 1, 2), (3, 4, 5)])
for r in out:
    r.pop("wall_s"); r["summary"].pop("compile_s")
pickle.dump(out, open(sys.argv[2], "wb"))
"""


def _run(tmp_path, cache, name):
    out = tmp_path / name
    subprocess.run([sys.executable, "-c", SCRIPT, str(cache), str(out)], check=True, timeout=600)
    return pickle.loads(out.read_bytes())


def _leaves(runs):
    for r in runs:
        yield from r["summary"].values()
        yield from r["series"].values()
        yield from r["telemetry"]["metrics"].values()


@pytest.mark.slow  # subprocesses
def test_results_are_bit_identical_with_and_without_the_cache(tmp_path):
    # the first process traces, exports and compiles afresh and writes both programs (traced
    # and compiled); the second loads them. That a stored program computes what the direct
    # trace computes is checked in test_programs.py, in one process.
    cache = tmp_path / "cache"
    cold = _run(tmp_path, cache, "cold.pkl")
    assert any(cache.iterdir())
    (program,) = (cache / "programs").iterdir()
    made = program.stat().st_ino
    warm = _run(tmp_path, cache, "warm.pkl")
    for a, b in zip(_leaves(cold), _leaves(warm), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    assert program.stat().st_ino == made  # the second process read the traced program


def test_run_uses_the_cache_by_default_and_says_where(capsys):
    from fp4lab import cli

    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default {cli.compile_cache_folder()})" in text
    assert "--no-compile-cache" in text
    assert str(cli.compile_cache_folder()).endswith("fp4lab/jax")
