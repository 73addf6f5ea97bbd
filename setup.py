"""fp4lab's CPU kernels, built at install (everything else is in pyproject.toml).

The C++ sources in fp4lab/core are compiled once, by `pip install`, into the shared library
fp4lab/core/_kernels (loaded with ctypes and registered with XLA's FFI by
`fp4lab.core.cpu_kernels`), against the FFI headers of jaxlib (a build requirement). The build is
optional: without a C++ compiler (or with one too old for the sources) the install still
succeeds, and fp4lab uses its reference statistics, saying so once. The library records the
jaxlib version and the sources it was built from; a run with another jaxlib, or after a source
changed in an editable checkout, builds the kernels on first use instead.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CORE = Path("fp4lab/core")
SOURCES = ("operand_stats.cc", "quantize.cc", "threefry.cc", "progress.cc", "built_for.cc")
FLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-w", "-Wno-psabi"]


def built_for() -> str:
    """'<jaxlib version> <sha256 of the sources>' (what fp4lab.core.cpu_kernels checks)."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update((CORE / name).read_bytes())
    return f"{importlib.metadata.version('jaxlib')} {digest.hexdigest()}"


class BuildKernels(build_ext):
    """build_ext with the FFI headers of the installed jaxlib and the build's identity."""

    def build_extensions(self) -> None:
        spec = importlib.util.find_spec("jaxlib")
        if spec is None or not spec.submodule_search_locations:
            print("fp4lab: jaxlib is not importable here: the CPU kernels build on first use")
            return
        include = os.path.join(list(spec.submodule_search_locations)[0], "include")
        for ext in self.extensions:
            ext.include_dirs.append(include)
            ext.define_macros.append(("FP4LAB_BUILT_FOR", f'"{built_for()}"'))
        super().build_extensions()


setup(
    ext_modules=[
        Extension(
            "fp4lab.core._kernels",
            sources=[str(CORE / name) for name in SOURCES],
            extra_compile_args=FLAGS,
            language="c++",
            optional=True,  # no compiler: the install succeeds, the reference statistics are used
        )
    ],
    cmdclass={"build_ext": BuildKernels},
)
