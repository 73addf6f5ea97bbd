"""fp4lab's CPU kernels, built at install (everything else is in pyproject.toml).

The C++ sources in fp4lab/core (and the step-report queue, fp4lab/sweep/step_reports.cc) are
compiled once, by `pip install`, into the shared library fp4lab/core/_kernels (loaded with
ctypes and registered with XLA's FFI by `fp4lab.core.cpu_kernels`), against the FFI headers of
jaxlib (a build requirement), and stamped as `fp4lab.core.kernel_build` says (loaded by its
path here: the package itself needs jax, which a build environment may lack). A build that
fails does not fail the install: it prints one line, the reason, and records it beside where
the library would be (_kernels.failed, keyed like the library), so that no run compiles again;
each run says the reason once and uses fp4lab's jnp reference (pip shows this line only with
-v, so the first import of fp4lab says it too). The compiler's own output goes into that
record, not to the screen.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

PACKAGE = Path("fp4lab")
CORE = PACKAGE / "core"
_spec = importlib.util.spec_from_file_location("fp4lab_kernel_build", CORE / "kernel_build.py")
kernel_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kernel_build)


class BuildKernels(build_ext):
    """build_ext with the FFI headers of the installed jaxlib and the build's stamp, which
    turns a failed build into one line and a record (no failed install)."""

    def build_extension(self, ext: Extension) -> None:
        record = Path(self.get_ext_fullpath(ext.name)).with_name(kernel_build.FAILED)
        include = kernel_build.include_dir()
        if include is None:
            print("fp4lab: jaxlib is not importable here: the CPU kernels build on first use")
            return
        stamp = kernel_build.built_for(CORE)
        ext.include_dirs.append(str(include))
        ext.define_macros.append(("FP4LAB_BUILT_FOR", f'"{stamp}"'))
        with tempfile.TemporaryFile("w+") as log:
            saved = [os.dup(1), os.dup(2)]
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(log.fileno(), 1)  # the compiler's output, into the record
            os.dup2(log.fileno(), 2)
            try:
                super().build_extension(ext)
                error = None
            except Exception as e:  # distutils' CompileError, LinkError, a missing compiler
                error = e
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for fd in saved:
                    os.close(fd)
            log.seek(0)
            text = log.read()
        if error is None:
            record.unlink(missing_ok=True)
            kernel_build.said_marker(record).unlink(missing_ok=True)
            return
        reason = kernel_build.first_error(text + "\n" + str(error))
        if isinstance(error, OSError) or "No such file or directory" in str(error):
            reason = f"no C++ compiler found ({error})"  # distutils' spawn found no executable
        kernel_build.record_failure(record, stamp, reason, text + "\n" + str(error))
        print(f"fp4lab: the CPU kernels did not build, the jnp reference runs: {reason}")

    def copy_extensions_to_source(self) -> None:
        """An in-place build (an editable install) copies the library, or the failure's
        record, into the package."""
        super().copy_extensions_to_source()
        built = Path(self.build_lib) / CORE / kernel_build.FAILED
        kernel_build.said_marker(CORE / kernel_build.FAILED).unlink(missing_ok=True)
        if built.exists():
            shutil.copy(built, CORE / kernel_build.FAILED)
        else:
            (CORE / kernel_build.FAILED).unlink(missing_ok=True)


setup(
    ext_modules=[
        Extension(
            "fp4lab.core._kernels",
            sources=[str(PACKAGE / path) for path in kernel_build.SOURCES],
            depends=[str(CORE / name) for name in kernel_build.HEADERS],
            extra_compile_args=[*kernel_build.FLAGS, *kernel_build.QUIET],
            language="c++",
            optional=True,  # a failed build is said and recorded (BuildKernels), not an error
        )
    ],
    cmdclass={"build_ext": BuildKernels},
)
