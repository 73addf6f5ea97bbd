"""The CPU kernels' build (`fp4lab.core.kernel_build`, setup.py): it compiles for ARM, the
quantizer's element loops give the same bits on ARM as on x86-64, it fails once and loudly,
and a library built against another jaxlib with the same FFI is loaded.

The aarch64 builds (Linux and macOS) use the cross compiler of the `ziglang` package (the dev
extra); the element loops' program (quantize_loops_check.cc) runs under qemu-aarch64 (Debian's
qemu-user, which .ci/run installs). Where either is missing the test says it is skipped and
why. The failures are made cheaply: a source broken at its first line, or a "compiler" that
logs its call and fails, in a copy of the package.
"""

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_kernels_at_install import copy_checkout  # tests/core/test_kernels_at_install.py

from fp4lab.core import cpu_kernels, kernel_build

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "fp4lab" / "core"


def _zig() -> list[str]:
    """The command of ziglang's C++ compiler; the test is skipped, saying why, without it."""
    if importlib.util.find_spec("ziglang") is None:
        pytest.skip(
            "ziglang (the aarch64 cross compiler, a dev dependency) is not installed: "
            'pip install -e ".[dev]"'
        )
    zig = Path(importlib.util.find_spec("ziglang").origin).parent / "zig"
    return [str(zig), "c++"] if zig.exists() else [sys.executable, "-m", "ziglang", "c++"]


@pytest.mark.parametrize("target", ["aarch64-linux-gnu", "aarch64-macos"])
def test_the_kernels_compile_for_arm(target, tmp_path):
    # every source, with the build's flags, against jaxlib's FFI headers; -O1 keeps it quick
    # (the float environment's inline assembly is assembled at any level)
    flags = [*kernel_build.FLAGS, *kernel_build.QUIET, "-O1", "-I", str(kernel_build.include_dir())]
    runs = [
        subprocess.Popen(
            [*_zig(), "-target", target, *flags, "-c", str(CORE / name), "-o", f"{name}.o"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in kernel_build.NAMES
    ]
    for name, run in zip(kernel_build.NAMES, runs, strict=True):
        out = run.communicate(timeout=300)[0]
        assert run.returncode == 0, f"{name} for {target}:\n{out[-3000:]}"
        assert (tmp_path / f"{name}.o").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() != "x86_64", reason="compares aarch64 with x86-64 bits")
def test_the_element_loops_give_the_x86_bits_on_arm_under_qemu(tmp_path):
    """quantize_loops_check.cc (the quantizer's element loops on the bit-exact grid, the cases
    below 2**-126 and the non-finite ones, in XLA's float environment) built for x86-64 and
    for aarch64-linux, run natively and under qemu-aarch64: the same bits in every clone."""
    zig = _zig()
    qemu = shutil.which("qemu-aarch64")
    if qemu is None:
        pytest.skip("qemu-aarch64 is not installed (Debian: apt-get install qemu-user)")
    native = kernel_build.compile_command()
    if native is None:
        pytest.skip("no C++ compiler for the x86-64 build")
    flags = [*kernel_build.FLAGS, *kernel_build.QUIET, "-I", str(kernel_build.include_dir())]
    source = [str(Path(__file__).with_name("quantize_loops_check.cc")), "-I", str(CORE)]
    builds = {
        "x86": [c for c in native if c not in ("-shared", "-fPIC")] + source,
        "arm": [*zig, "-target", "aarch64-linux-musl", *flags, *source],
    }
    runs = {
        name: subprocess.Popen(
            [*command, "-o", name], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for name, command in builds.items()
    }
    for name, run in runs.items():
        out = run.communicate(timeout=1200)[0].decode()
        assert run.returncode == 0, f"{name}:\n{out[-3000:]}"
    lines = {}
    for name, command in (("x86", ["./x86"]), ("arm", [qemu, "./arm"])):
        got = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert got.returncode == 0, f"{name}: {got.stderr[-3000:]}"
        lines[name] = got.stdout.splitlines()
    # the float environment flushes a product below 2**-126 to zero on both
    env = "environment: 2**-100 * 2**-30 = 00000000 (flushed: 00000000)"
    assert lines["x86"][0] == lines["arm"][0] == env, (lines["x86"][0], lines["arm"][0])
    x86 = {tuple(line.split()[:2]): line.split()[2:] for line in lines["x86"][1:]}
    arm = {tuple(line.split()[:2]): line.split()[2:] for line in lines["arm"][1:]}
    assert len(arm) >= 19 and {clone for _, clone in arm} == {"baseline"}, sorted(arm)
    for (case, _), got in arm.items():  # NEON against SSE2 (and the wider x86 clones)
        assert got == x86[(case, "baseline")], (case, got, x86[(case, "baseline")])
    for (case, clone), got in x86.items():
        assert got == x86[(case, "baseline")], (case, clone)


def test_clang_builds_the_x86_clones(tmp_path):
    # the quantizer's clones under Clang's target pragma (GCC builds them everywhere else)
    flags = [*kernel_build.FLAGS, *kernel_build.QUIET, "-O1", "-I", str(kernel_build.include_dir())]
    source = CORE / "quantize.cc"
    run = subprocess.run(
        [*_zig(), "-target", "x86_64-linux-gnu", *flags, "-c", str(source), "-o", "q.o"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]


def test_a_library_of_another_jaxlib_with_the_same_ffi_is_loaded():
    here = kernel_build.built_for()
    version, ffi, digest = here.split()
    major, minor = map(int, ffi.removeprefix("ffi-").split("."))
    assert kernel_build.fits(here, here)
    assert kernel_build.fits(f"0.0.1 {ffi} {digest}", here)  # an isolated build's jaxlib
    if minor > 0:
        assert kernel_build.fits(f"{version} ffi-{major}.{minor - 1} {digest}", here)
    assert not kernel_build.fits(f"{version} ffi-{major}.{minor + 1} {digest}", here)
    assert not kernel_build.fits(f"{version} ffi-{major + 1}.{minor} {digest}", here)
    assert not kernel_build.fits(f"{version} {ffi} {'0' * 64}", here)  # other sources
    assert not kernel_build.fits(f"{version} {digest}", here)  # an older fp4lab's stamp


def _logging_compiler(tmp_path: Path) -> tuple[Path, Path]:
    """A "C++ compiler" that logs each call and fails: (its path, its log)."""
    log = tmp_path / "calls.log"
    cxx = tmp_path / "failing-c++"
    cxx.write_text(
        f'#!/bin/sh\necho "$@" >> {log}\necho "error: this compiler fails" >&2\nexit 1\n'
    )
    cxx.chmod(0o755)
    return cxx, log


PROBE = (
    "import json; from fp4lab.core import cpu_kernels as k; "
    "print(json.dumps([k.available(), k.build_error(), k.available()]))"
)


def _probe(src: Path, tmp_path: Path, **env) -> tuple[list, list[str]]:
    """(available, build_error, available) in a fresh process on the copy, and its stderr
    lines that fp4lab wrote."""
    env = dict(os.environ, PYTHONPATH=str(src), JAX_PLATFORMS="cpu", **env)
    env.setdefault("FP4LAB_KERNEL_CACHE", str(tmp_path / "cache"))
    run = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    said = [line for line in run.stderr.splitlines() if line.startswith("fp4lab:")]
    return json.loads(run.stdout.strip().splitlines()[-1]), said


def test_a_source_that_does_not_build_is_said_once_at_install_and_never_built_again(tmp_path):
    src = copy_checkout(
        tmp_path, broken="cpu_env.h"
    )  # every kernel source fails at its first include
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    out = (build.stdout + build.stderr).splitlines()
    said = [line for line in out if "fp4lab:" in line or "broken on purpose" in line]
    assert len(said) == 1 and "broken on purpose" in said[0], said  # one line, the reason
    assert not list((src / "fp4lab" / "core").glob("_kernels*.so"))
    record = json.loads((src / "fp4lab" / "core" / kernel_build.FAILED).read_text())
    assert (
        record["built_for"].split()[2] == kernel_build.built_for(src / "fp4lab" / "core").split()[2]
    )
    assert "broken on purpose" in record["log"]  # the compiler's output, kept
    # the first import says the reason, without pip -v, and later imports say nothing
    cxx, log = _logging_compiler(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(src), CXX=str(cxx))
    imports = [
        subprocess.run(
            [sys.executable, "-c", "import fp4lab"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        for _ in range(2)
    ]
    first, second = ([ln for ln in i.stderr.splitlines() if "fp4lab:" in ln] for i in imports)
    assert len(first) == 1 and "the install could not build" in first[0], first
    assert "broken on purpose" in first[0] and second == [], second
    # a run: the reason once, and no compiler started (a compiler that would log its call)
    for _ in range(2):  # every process, each once
        got, said = _probe(src, tmp_path, CXX=str(cxx))
        assert got[:1] == [False] and got[2] is False
        assert "the install could not build" in got[1] and "broken on purpose" in got[1]
        assert len(said) == 1 and "broken on purpose" in said[0], said
    assert not log.exists() and not (tmp_path / "cache").exists()


def test_a_build_on_first_use_that_fails_is_not_tried_again(tmp_path):
    src = copy_checkout(tmp_path)  # no library from an install
    cxx, log = _logging_compiler(tmp_path)
    for _ in range(2):
        got, said = _probe(src, tmp_path, CXX=str(cxx))
        assert got[0] is False and "this compiler fails" in got[1], got
        assert len(said) == 1 and "this compiler fails" in said[0], said
    assert len(log.read_text().splitlines()) == 1  # the second process compiled nothing
    (record,) = (tmp_path / "cache").glob("kernels-*.failed")
    assert json.loads(record.read_text())["built_for"] == kernel_build.built_for()
    record.unlink()  # removing the record tries again
    _probe(src, tmp_path, CXX=str(cxx))
    assert len(log.read_text().splitlines()) == 2


def test_this_process_loaded_a_library_that_fits():
    stamp = kernel_build.built_for()
    if cpu_kernels.library() is not None and cpu_kernels.library().name.startswith("_kernels"):
        import ctypes

        handle = ctypes.CDLL(str(cpu_kernels.library()))
        handle.fp4lab_kernels_built_for.restype = ctypes.c_char_p
        assert kernel_build.fits(handle.fp4lab_kernels_built_for().decode(), stamp)
