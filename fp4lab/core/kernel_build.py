"""Building and finding the library of the CPU kernels: one build, which fails once and loudly.

The C++ sources beside this module, and the step-report queue beside the sweep code that
drains it (`SOURCES`), are compiled into one shared library against the FFI headers of jaxlib,
at install (setup.py, which loads this file by its path: standard library only at import) or,
where the install left none that fits, by the first process that needs a kernel (`load`).
A library is stamped with `built_for()`:

    "<jaxlib version> ffi-<major>.<minor> <sha256 of the sources and headers>"

and a process loads it where the sources are the same and its jaxlib's FFI API (the
XLA_FFI_API_MAJOR / MINOR of jaxlib's c_api.h: a stable binary interface) has the same major
version and at least the minor one (`fits`): a build whose isolated build environment
resolved another jaxlib than the one the user runs is loaded, not rebuilt. A build that
fails leaves a record beside where its library would be, keyed the same way (setup.py:
`_kernels.failed` in the package; on first use: `kernels-<hash>.failed` in `cache_folder()`),
so no later process, sweep workers included, compiles again: each says the one-line reason
once instead. Removing the record (or reinstalling) tries again. pip shows a build backend's
output only under -v, so the first import of fp4lab after such an install says the line
(`say_install_failure`), once: a marker beside the record keeps later imports quiet.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = [
    "NAMES",
    "SOURCES",
    "HEADERS",
    "FLAGS",
    "FAILED",
    "built_for",
    "fits",
    "include_dir",
    "cache_folder",
    "compile_command",
    "failure",
    "record_failure",
    "first_error",
    "find",
    "said_marker",
    "say_install_failure",
    "install_failure_said",
]

HERE = Path(__file__).parent
PACKAGE = HERE.parent  # the fp4lab folder: the sources' paths below are relative to it
NAMES = ("operand_stats.cc", "quantize.cc", "threefry.cc", "built_for.cc")  # core's own sources
# every source of the library, in the digest's order: core's, and the step-report queue beside
# the sweep code that drains it
SOURCES = (
    "core/operand_stats.cc",
    "core/quantize.cc",
    "core/threefry.cc",
    "sweep/step_reports.cc",
    "core/built_for.cc",
)
HEADERS = ("cpu_env.h", "quantize_loops.h", "float_bits.h")  # in core/, included; in the digest
# no reordering of float arithmetic (no contraction, no fast-math value changes); no trapping
# math, which -fno-fast-math turns back on and which keeps GCC from if-converting (and so
# from vectorizing) the quantizer's loops outside AVX-512 (it changes no value)
FLAGS = ("-O3", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math")
QUIET = ("-w", "-Wno-psabi")
FAILED = "_kernels.failed"  # beside the installed library: why the install could not build it


def include_dir() -> Path | None:
    """jaxlib's include folder (its FFI headers), found without importing jax; None without
    jaxlib."""
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "include"


def _ffi_version(include: Path) -> str:
    text = (include / "xla" / "ffi" / "api" / "c_api.h").read_text()
    major, minor = (re.search(rf"#define XLA_FFI_API_{w} (\d+)", text) for w in ("MAJOR", "MINOR"))
    return f"{major.group(1)}.{minor.group(1)}"


def built_for(folder: Path = HERE) -> str:
    """The stamp of a library built here from the sources of the package whose core folder is
    `folder` (`SOURCES`, from the package folder above it), against the installed jaxlib:
    '<jaxlib version> ffi-<major>.<minor> <sha256 of the sources and headers>'."""
    digest = hashlib.sha256()
    for path in [*SOURCES, *(f"core/{name}" for name in HEADERS)]:
        digest.update((folder.parent / path).read_bytes())
    version = importlib.metadata.version("jaxlib")
    return f"{version} ffi-{_ffi_version(include_dir())} {digest.hexdigest()}"


def fits(stamp: str, here: str) -> bool:
    """Whether a library stamped `stamp` loads in a process whose own stamp is `here`: the
    same sources, the same FFI major version, and a minor one no newer than the process's."""
    try:
        _, ffi, digest = stamp.split()
        _, ffi_here, digest_here = here.split()
        major, minor = map(int, ffi.removeprefix("ffi-").split("."))
        major_here, minor_here = map(int, ffi_here.removeprefix("ffi-").split("."))
    except ValueError:  # a stamp of another form (an older fp4lab's): rebuilt
        return False
    return digest == digest_here and major == major_here and minor <= minor_here


def cache_folder() -> Path:
    """Where built kernels are kept: $FP4LAB_KERNEL_CACHE, else <user cache>/fp4lab/kernels."""
    if os.environ.get("FP4LAB_KERNEL_CACHE"):
        return Path(os.environ["FP4LAB_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fp4lab" / "kernels"


def _compiler() -> str | None:
    if os.environ.get("CXX"):
        return os.environ["CXX"]
    return next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)


def compile_command(extra: tuple[str, ...] = ()) -> list[str] | None:
    """The command that builds sources into a shared library (sources and `-o` to append),
    with `extra` flags after the fixed ones (e.g. "-mavx2"); None without a C++ compiler."""
    cxx = _compiler()
    if cxx is None:
        return None
    return [cxx, *FLAGS, "-shared", "-fPIC", *QUIET, *extra, "-I", str(include_dir())]


def failure(record: Path, stamp: str) -> str | None:
    """The reason a failed build recorded in `record` gave, where it was a build of these
    sources for this FFI (`fits`); None where there is no such record."""
    try:
        got = json.loads(record.read_text())
        return got["reason"] if fits(got["built_for"], stamp) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def said_marker(record: Path) -> Path:
    """The marker beside a failed install's record: its line was said at an import."""
    return record.with_name(record.name + ".said")


def record_failure(record: Path, stamp: str, reason: str, log: str = "") -> None:
    """Writes the record of a failed build (atomically: a reader sees all of it or none); a
    new failure is said again at the next import (its marker removed)."""
    record.parent.mkdir(parents=True, exist_ok=True)
    said_marker(record).unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=record.parent)
    with os.fdopen(fd, "w") as f:
        json.dump({"built_for": stamp, "reason": reason, "log": log[-20000:]}, f)
    os.replace(tmp, record)


def first_error(log: str) -> str:
    """The line of a compiler's output that says what went wrong (its first error), else its
    last line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["(no output)"])[0][:300]


_said = False  # this process said the install's failure at its import


def say_install_failure() -> bool:
    """At the first import of fp4lab after an install that could not build the kernels (a
    record `FAILED` for these sources): the reason in one line on stderr, and a marker beside
    the record so that later imports say nothing (a process that needs a kernel still says
    it once, `cpu_kernels`). Returns whether it said it. Costs one file check otherwise."""
    global _said
    record = HERE / FAILED
    if not record.exists() or said_marker(record).exists():
        return False
    try:
        reason = failure(record, built_for())
    except (OSError, ValueError, AttributeError, importlib.metadata.PackageNotFoundError):
        return False  # no jaxlib to stamp with: the run-time line says it
    if reason is None:
        return False
    print(
        f"fp4lab: the install could not build the CPU kernels, the jnp reference runs: "
        f"{reason} ({record})",
        file=sys.stderr,
    )
    _said = True
    try:
        said_marker(record).touch()
    except OSError:  # a read-only install: said at every import
        pass
    return True


def install_failure_said() -> bool:
    """Whether this process said the install's failure at its import (`say_install_failure`)."""
    return _said


def _stamp_of(lib: Path) -> str:
    import ctypes

    try:
        handle = ctypes.CDLL(str(lib))
        handle.fp4lab_kernels_built_for.restype = ctypes.c_char_p
        return handle.fp4lab_kernels_built_for().decode()
    except (OSError, AttributeError):
        return ""


def _installed(stamp: str) -> tuple[Path | None, str]:
    """(the library `pip install` built, if it fits this process) or (None, why not: "" where
    the install built none and recorded no failure)."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        lib = HERE / f"_kernels{suffix}"
        if lib.exists():
            built = _stamp_of(lib)
            if fits(built, stamp):
                return lib, ""
            return None, f"the installed kernels ({lib.name}) were built for '{built[:40]}'"
    reason = failure(HERE / FAILED, stamp)
    if reason is not None:
        return None, f"the install could not build the CPU kernels: {reason} ({HERE / FAILED})"
    return None, ""


def _built_here(stamp: str) -> tuple[Path | None, str]:
    """(the library built on first use in `cache_folder()`) or (None, why not), a failure
    recorded beside it so that no other process compiles again."""
    command = compile_command()
    if command is None:
        return None, "no C++ compiler found (set CXX, or install g++ or clang++)"
    digest = hashlib.sha256(" ".join([stamp, platform.machine(), *command[:-2]]).encode())
    folder = cache_folder()
    lib = folder / f"kernels-{digest.hexdigest()[:16]}.so"
    record = lib.with_suffix(".failed")
    if lib.exists():
        return lib, ""
    reason = failure(record, stamp)
    if reason is not None:
        return None, f"{reason} (an earlier build; remove {record} to try again)"
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # built beside its final name, then renamed: concurrent processes never load a
        # half-written file
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
        os.close(fd)
        sources = [str(PACKAGE / path) for path in SOURCES]
        run = subprocess.run(
            [*command, *sources, "-o", tmp], capture_output=True, text=True, check=False
        )
        if run.returncode:
            log = f"{' '.join(command)} failed:\n{run.stderr.strip()}"
            record_failure(record, stamp, first_error(run.stderr), log)
            return None, f"{first_error(run.stderr)} (remove {record} to try again)"
        os.replace(tmp, lib)
    except OSError as e:
        return None, f"cannot build {lib}: {e}"
    finally:  # no temporary left behind, whatever failed
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return lib, ""


def find() -> tuple[Path | None, str]:
    """(the library to load, "") or (None, the one-line reason there is none): the installed
    one where it fits; else, unless the install recorded a failure of these sources, the one
    built on first use (built now where needed, or the failure an earlier process recorded)."""
    stamp = built_for()
    lib, why = _installed(stamp)
    if lib is not None or why.startswith("the install could not"):
        return lib, why
    return _built_here(stamp)
