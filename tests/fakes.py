"""Pieces the sweep and reliability tests share: a compute without jax, a `fp4lab run`
subprocess killed mid-run, the live descendants of a process."""

import signal
import time
from pathlib import Path

import numpy as np


def fake_compute(config, seeds):
    """Plain data shaped like compute_cell's, from the config and seeds (no jax, instant)."""
    out = []
    for s in seeds:
        loss = float(config["lr"] * 100 + config["steps"] + sum(s) / 10)
        summary = {"final_loss": loss, "final_train_loss": loss, "eval_loss": loss}
        summary |= {"loss_floor": 0.0, "loss_gap": loss, "diverged": False}
        summary |= {"divergence_step": float("nan"), "divergence_kind": "none"}
        summary |= {"target_loss": float("nan"), "tokens_to_target": float("nan")}
        summary |= {"tokens_per_step": 32, "eval_hp": loss}
        out.append(
            {
                "summary": summary,
                "series": {"loss": np.full(config["steps"], loss, np.float32)},
                "telemetry": {"steps": [], "metrics": {}},
                "wall_s": 0.0,
            }
        )
    return out


def kill_after_records(proc, runs: Path, records: int = 2, timeout_s: float = 300) -> dict:
    """SIGKILLs `proc` (a `fp4lab run` subprocess with stderr piped) once `runs` holds
    `records` run records; returns {file name: bytes} of the records then on disk."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and len(list(runs.glob("*.json"))) < records:
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return {f.name: f.read_bytes() for f in runs.glob("*.json")}


def descendants(pid: int) -> set[int]:
    """The live (non-zombie) descendants of `pid`, from /proc."""
    parents = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(d.name)] = int(fields[1])
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - out
        out |= frontier
    return out
