"""A `kill -9` during compaction loses nothing: before the parts are in place, between them,
and while the per-run files are being deleted; the next compaction finishes the job."""

import shutil
import signal
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
from fakes import fake_compute  # tests/fakes.py

from fp4lab import sweep
from fp4lab.sweep import compact, store

# compaction in a subprocess that says what it has just done, pausing after each step so that
# the test can kill it there
SCRIPT = textwrap.dedent(
    """
    import os, pathlib, sys, time
    from fp4lab.sweep import compact

    replace, unlink = os.replace, pathlib.Path.unlink

    def noisy_replace(a, b):
        replace(a, b)
        print("renamed", os.path.basename(b), flush=True)
        time.sleep(0.5)

    def noisy_unlink(self, missing_ok=False):
        unlink(self, missing_ok=missing_ok)
        print("deleted", self.name, flush=True)
        time.sleep(0.05)

    os.replace, pathlib.Path.unlink = noisy_replace, noisy_unlink
    print("started", flush=True)
    compact.compact(sys.argv[1])
    """
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kill")
    experiment = tmp / "exp.py"
    experiment.write_text(
        "from fp4lab.train.config import Config\n"
        "def get_config():\n"
        "    return Config(task='teacher', steps=20, seed_batch=2)\n"
        "def sweep(add):\n"
        "    add('a', recipe='fp32')\n    add('b', recipe='bf16')\n"
    )
    out = tmp / "res"
    sweep.run_experiment(
        sweep.load_experiment(experiment, seeds=6), out, progress=False, compute=fake_compute
    )
    return out


def tables(out):
    res = store.load(out)
    runs = res.runs.sort_values("run_id").reset_index(drop=True)
    metrics = res.metrics.sort_values(["run_id", "metric", "step"]).reset_index(drop=True)
    return runs, metrics


@pytest.mark.parametrize(
    "after",
    ["started", "renamed metrics-0001.parquet", "renamed records-0001.parquet", "deleted", 7],
)
def test_a_kill_during_compaction_loses_nothing(folder, tmp_path, after):
    before = tables(folder)
    out = tmp_path / "res"
    shutil.copytree(folder, out)
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(out)], stdout=subprocess.PIPE, text=True
    )
    deleted = 0
    for line in proc.stdout:  # kill right after the step named (or the 7th deletion)
        deleted += line.startswith("deleted")
        if line.strip() == after or (after == "deleted" and deleted == 1) or deleted == after:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "compaction ended before the kill"
    for a, b in zip(tables(out), before, strict=True):
        pd.testing.assert_frame_equal(a, b)
    assert compact.compact(out)["runs"] in (0, 12)  # the rest of the job, or all of it
    assert not list((out / "runs").glob("*.json")) and not list((out / "runs").glob("*.parquet"))
    assert not list((out / "compact").glob(".*"))  # no temporary file left
    for a, b in zip(tables(out), before, strict=True):
        pd.testing.assert_frame_equal(a, b)
