"""Where a run was computed: package versions, git revision, python, backend, device, CPU, and
the quantizer that ran (the CPU kernel or the jnp path, and why: `kernel_route.choice`).

A record's `provenance` (`fp4lab.sweep.store.provenance`: `host` and the numerics version)
says what made its numbers; `code_version` names the code in one string, `cpu` the host
CPU with the vector extensions that decide XLA's summation orders, and `numerics_route` whether
this process computes on the CPU without fp4lab's kernels (a route run ids name).
"""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

__all__ = ["code_version", "cpu", "host", "numerics_route", "package_versions"]

_PACKAGES = ("fp4lab", "jax", "jaxlib", "flax", "optax", "ml_dtypes", "numpy")


def _git(*args: str) -> str:
    here = Path(__file__).resolve().parent
    try:
        return subprocess.run(
            ["git", *args], cwd=here, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# The vector extensions among which XLA's CPU kernels (its own code, Eigen, YNNPACK, oneDNN)
# choose at run time: two CPUs that differ in them may sum in different orders.
_CPU_FEATURES = (
    "sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "asimd", "sve", "sve2",
)  # fmt: skip


def cpu() -> str:
    """This host's CPU as one string: its model name and the vector extensions of
    `_CPU_FEATURES` it has, e.g. "Intel(R) Xeon(R) Processor [avx avx2 avx512f ...]".

    Read from /proc/cpuinfo where there is one (Linux), else what `platform` says. A run's
    last bits on the CPU backend depend on these: `fl.sweep.reproduce` names both CPUs when a
    run made on another one does not reproduce."""
    model, flags = "", set()
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    have = [f for f in _CPU_FEATURES if f in flags]
    return f"{model} [{' '.join(have)}]" if have else model


def package_versions() -> dict[str, str | None]:
    """{package: installed version, None when it is not installed} of fp4lab and the packages
    its numbers depend on (jax, jaxlib, flax, optax, ml_dtypes, numpy)."""
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def host() -> dict[str, Any]:
    """What this process runs on and with: package versions, git revision (and whether the tree
    had edits), python, backend, device kind and host CPU (`cpu`), time: a run's provenance
    less its numerics version (`fp4lab.sweep.store.provenance` adds it)."""
    import jax

    from fp4lab.core import kernel_route

    versions = package_versions()
    rev = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no") if rev else ""
    device = jax.devices()[0]
    return {
        "versions": versions,
        "python": platform.python_version(),
        "git_revision": rev or None,
        "git_dirty": bool(dirty) if rev else None,
        "backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "cpu": cpu(),
        "quantizer": kernel_route.choice()[1],  # the CPU kernel or the jnp path, and why
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def code_version(prov: dict[str, Any] | None) -> str:
    """The code that made a run, as one string: fp4lab version, git revision, jax, jaxlib."""
    prov = prov or {}
    v = prov.get("versions") or {}
    rev = (prov.get("git_revision") or "no git")[:10]
    return f"fp4lab {v.get('fp4lab')} ({rev}), jax {v.get('jax')}, jaxlib {v.get('jaxlib')}"


def numerics_route() -> dict[str, str]:
    """{"numerics_route": "reference"} where this process computes on the CPU without fp4lab's
    CPU kernels (`fp4lab.core.cpu_kernels.available` is False: the library cannot be built or
    loaded), else {}. Such runs compute the telemetry's statistics with the reference formulas
    (float32 sums: other last bits), and the program XLA compiles around them differs, which can
    move the last bit of a gradient norm; so they carry ids of their own
    (`fp4lab.sweep.store.data_hashes` adds this), and one warning per process says so. Loads
    jax (where a run id is computed, not in `ls`/`show`)."""
    import jax

    from fp4lab.core import cpu_kernels

    if jax.default_backend() != "cpu" or cpu_kernels.available():
        return {}
    warnings.warn(  # why the kernels are missing is said once, by cpu_kernels
        "fp4lab: without the CPU kernels (said above) runs are computed with the reference "
        "formulas and carry their own run ids (numerics_route=reference in their data hashes)",
        RuntimeWarning,
        stacklevel=3,
    )
    return {"numerics_route": "reference"}
