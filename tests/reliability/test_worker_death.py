"""The local process pool: a worker that dies (`kill -9`, an out-of-memory kill) costs a retry,
not the sweep; and a sweep stopped by Ctrl-C, SIGTERM or a full disk ends with its own line,
no thread traceback after it.

The computes below run in spawned worker processes, which import this module by name."""

import dataclasses
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from fp4lab.sweep import executors
from fp4lab.sweep.records import StoreError


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    marker: str = ""
    pause: float = 0.0

    def to_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Cell:
    config: Config


def dies_once(config, seeds):
    """Kills its own worker the first time it computes the cell named "dies"."""
    time.sleep(config["pause"])
    if config["name"] == "dies" and not os.path.exists(config["marker"]):
        Path(config["marker"]).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return [{"cell": config["name"], "seed": s} for s in seeds]


def always_dies(config, seeds):
    if config["name"] == "dies":
        os.kill(os.getpid(), signal.SIGKILL)
    return [{"cell": config["name"], "seed": s} for s in seeds]


def work(names, **kw):
    return [(Cell(Config(n, **kw)), [(i, i, i)]) for i, n in enumerate(names)]


def test_a_batch_whose_worker_died_is_retried(tmp_path, capsys):
    todo = work(["a", "dies", "b"], marker=str(tmp_path / "died"), pause=0.2)
    done = []
    executors.run_processes(todo, lambda *a: done.append(a), dies_once, workers=2)
    assert (tmp_path / "died").exists(), "the worker never died"
    assert sorted(todo[i][0].config.name for i, _, _ in done) == ["a", "b", "dies"]
    assert all(error is None and results for _, results, error in done)
    assert capsys.readouterr().err.count("a worker process died") == 1


def test_a_batch_whose_worker_always_dies_fails_after_its_retries(capsys):
    todo = work(["a", "dies", "b"])
    done = {}
    finish = lambda i, results, error: done.update({todo[i][0].config.name: error})  # noqa: E731
    executors.run_processes(todo, finish, always_dies, workers=2, max_retries=1)
    assert done["a"] is None and done["b"] is None  # lost beside it, they are not charged
    assert "died each time (2 times); max_retries=1" in done["dies"]
    assert "recorded as failed after 2 tries" in capsys.readouterr().err


@pytest.mark.parametrize("stop", [KeyboardInterrupt, StoreError])  # Ctrl-C/SIGTERM, full disk
def test_a_stopped_sweep_leaves_no_thread_traceback(monkeypatch, stop):
    caught = []
    monkeypatch.setattr(threading, "excepthook", lambda args: caught.append(args))
    before = set(threading.enumerate())
    todo = work(list("abcdefghij"), pause=0.3)

    def finish(*args):
        raise stop("no space left on the device")

    with pytest.raises(stop):
        executors.run_processes(todo, finish, dies_once, workers=2)
    for thread in set(threading.enumerate()) - before:  # the pool's own threads end
        thread.join(10)
    assert not caught, [f"{a.exc_type.__name__}: {a.exc_value}" for a in caught]
