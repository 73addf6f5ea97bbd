"""The CPU kernels are built by `pip install` (setup.py), not by a run.

With a compiler at install, a later process loads the installed library and runs no compiler
(checked with no compiler on its PATH and an empty kernel cache). Without one, the install still
succeeds (a wheel built with no compiler on the PATH, used in place of the checkout), saying
why in one line and recording it in the wheel (`fp4lab/core/_kernels.failed`), and a sweep of
three recipes (BF16, NVFP4 with its stochastic rounding and Hadamard, NVFP4-RL; one seed, a
few steps, telemetry at every step) runs with the reference statistics, said once, and no
compiler is looked for again.
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fp4lab.core import cpu_kernels

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's commands; no compiler among them

PROBE = """
import json, warnings
from fp4lab.core import cpu_kernels
import fp4lab
print(json.dumps({"available": cpu_kernels.available(), "error": cpu_kernels.build_error(),
                  "library": str(cpu_kernels.library()), "package": fp4lab.__file__}))
"""


TINY = """
from fp4lab.train.config import Config

def get_config():
    return Config(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32, 32),
                  batch_size=32, steps=3, eval_batches=1, telemetry_every=1)

def sweep(add):
    add("bf16", recipe="bf16")
    add("nvfp4", recipe="nvfp4")
    add("nvfp4-rl", recipe="nvfp4-rl")
"""


def _no_compiler_env(tmp_path: Path, **extra) -> dict[str, str]:
    """The environment of a process that finds no C++ compiler and no kernels built before."""
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CC", "PYTHONPATH")}
    env |= {"PATH": str(BIN), "FP4LAB_KERNEL_CACHE": str(tmp_path / "kernel-cache")}
    env |= {"JAX_PLATFORMS": "cpu"} | extra
    for name in ("c++", "g++", "clang++", "gcc", "cc"):
        assert shutil.which(name, path=env["PATH"]) is None, f"{name} is on {BIN}"
    return env


def copy_checkout(tmp_path: Path, broken: str | None = None) -> Path:
    """A copy of the checkout's build inputs and package, without a library or a failure's
    record, in tmp_path/src; `broken` (a source's name) fails at its first line."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "fp4lab",
        src / "fp4lab",
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.failed", "*.said"),
    )
    if broken is not None:
        path = src / "fp4lab" / "core" / broken
        path.write_text("#error broken on purpose\n" + path.read_text())
    return src


def _probe(env: dict[str, str], cwd: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=cwd, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_installed_library_is_loaded_and_no_compiler_runs(tmp_path):
    installed = sorted((ROOT / "fp4lab" / "core").glob("_kernels*.so"))
    if not installed:  # only an install without a compiler leaves none
        assert shutil.which("c++") is None and shutil.which("g++") is None, (
            "a compiler is here but `pip install -e .` built no fp4lab/core/_kernels*.so"
        )
        return
    got = _probe(_no_compiler_env(tmp_path), tmp_path)
    assert got["available"], got["error"]
    assert Path(got["library"]) == installed[0]
    assert not (tmp_path / "kernel-cache").exists()  # nothing was built on first use
    # and the library the test process uses is the same one
    assert cpu_kernels.library() == installed[0]


@pytest.mark.slow  # builds a wheel
def test_an_install_without_a_compiler_succeeds_and_runs_with_the_reference_statistics(
    tmp_path,
):
    source = copy_checkout(tmp_path)
    env = _no_compiler_env(tmp_path)
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w"]
        + [str(wheels), str(source)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    said = [ln for ln in (build.stdout + build.stderr).splitlines() if "CPU kernels" in ln]
    assert len(said) == 1 and "no C++ compiler found" in said[0], said  # one line, the reason
    (wheel,) = wheels.glob("fp4lab-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        assert not [n for n in z.namelist() if n.endswith(".so")]  # no kernels were built
        assert "fp4lab/core/_kernels.failed" in z.namelist()  # and why not, for the runs
        z.extractall(site)
    env = env | {"PYTHONPATH": str(site)}
    got = _probe(env, tmp_path)
    assert Path(got["package"]).is_relative_to(site)  # the wheel's package, not the checkout
    assert not got["available"] and "no C++ compiler found" in got["error"]
    assert "the install could not build" in got["error"]  # the install's record, read
    experiment = tmp_path / "tiny.py"
    experiment.write_text(TINY)
    argv = ["run", str(experiment), "--seeds", "1", "--steps", "3", "--out", "r", "--quiet"]
    run = subprocess.run(
        [sys.executable, "-m", "fp4lab.cli", *argv, "--no-figures", "--no-compile-cache"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "3 runs done" in run.stdout, run.stdout
    said = [line for line in run.stderr.splitlines() if "no C++ compiler found" in line]
    assert len(said) == 1, run.stderr  # the reference statistics, said once
