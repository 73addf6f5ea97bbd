"""One writer per results folder: a second `fp4lab run` into a folder being written stops at once
with one line naming the first (before it could rewrite experiment.json and turn the first's
runs stale), and a lock left by a writer that died blocks nobody."""

import os
import signal
import socket
import subprocess
import sys

import pytest

import fp4lab as fl
from fp4lab import cli
from fp4lab.sweep import lock


def test_a_second_writer_gets_one_line_naming_the_first(
    tmp_path, capsys, experiment_file, run_sweep
):
    out = tmp_path / "res"
    first = experiment_file(steps=3)
    run_sweep(first, out)
    manifest = (out / "experiment.json").read_bytes()
    second = experiment_file(steps=5, name="exp")  # the same experiment with other --steps
    with lock.writer(out):  # the first writer, still running
        with pytest.raises(lock.FolderBusy, match=f"process {os.getpid()} on"):
            run_sweep(second, out)
        assert cli.main(["run", str(second), "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert f"process {os.getpid()} on {socket.gethostname()}" in err[0]
        assert "another fp4lab run" in err[0]
    assert (out / "experiment.json").read_bytes() == manifest  # the first's cells stay current
    assert len(fl.load(out).runs) == 2


def test_a_lock_held_by_a_dead_process_does_not_block(tmp_path, experiment_file, run_sweep):
    out = tmp_path / "res"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom fp4lab.sweep import lock\n"
            "with lock.writer(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(600)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(lock.FolderBusy, match=f"process {holder.pid} on"):
            run_sweep(experiment_file(), out)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert (out / lock.LOCK_FILE).exists()  # the file stays; its lock died with its process
    assert run_sweep(experiment_file(), out)["done"] == 2
