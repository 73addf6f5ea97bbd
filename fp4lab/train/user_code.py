"""The user's own modules: the code an experiment file runs besides the file itself.

A run's id covers its experiment file's source (`fp4lab.train.own.hashes`) and, through
`imported`, the source of every module the file imports that is not part of an installed
package: found by reading the file's `import` statements (anywhere in it, relative ones
included), then those of each module found, and so on. A module counts as installed when its
file lies in the standard library or a site-packages folder (`INSTALLED`), or in fp4lab itself
(its changes of numbers are covered by the numerics version). An import made at run time from a
computed name (`importlib.import_module(name)`, `__import__`) is not seen; name such a module in
a plain `import` statement, or its file in DATA_FILES.

Only the standard library is imported here: the sweep's host side loads experiment files with it.
"""

from __future__ import annotations

import ast
import importlib.machinery
import site
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

__all__ = ["INSTALLED", "imported", "is_user_file", "module_file"]

_FP4LAB = Path(__file__).resolve().parents[1]
INSTALLED = tuple(  # the standard library and the site-packages folders
    Path(p).resolve()
    for p in {
        *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
        *site.getsitepackages(),
        site.getusersitepackages(),
    }
)


def is_user_file(path: str | Path | None) -> bool:
    """Whether a module's file is the user's code: a source file outside the standard library,
    site-packages and fp4lab."""
    if not path:
        return False
    path = Path(path).resolve()
    return path.is_file() and not any(path.is_relative_to(p) for p in (*INSTALLED, _FP4LAB))


def module_file(module: ModuleType) -> Path | None:
    """The file of a loaded module if it is the user's code (`is_user_file`), else None."""
    path = getattr(module, "__file__", None)
    return Path(path).resolve() if is_user_file(path) else None


def imported(source: bytes, path: Path, package: str = "") -> dict[str, Path]:
    """{module name: file} of the user's modules that `source` (the file at `path`, a module of
    `package` for its relative imports) imports, directly or through one another, in name
    order (module docstring)."""
    found: dict[str, Path] = {}
    todo = [(source, path, package)]
    while todo:
        text, where, pkg = todo.pop()
        for name in _imports(text, where, pkg):
            if name in found:
                continue
            file = _find(name)
            if file is not None:
                found[name] = file
                parent = name if file.name == "__init__.py" else name.rpartition(".")[0]
                todo.append((file.read_bytes(), file, parent))
    return dict(sorted(found.items()))


def _imports(source: bytes, where: Path, package: str) -> list[str]:
    """The absolute names of the modules (and their parent packages) `source` imports."""
    try:
        tree = ast.parse(source, filename=str(where))
    except (SyntaxError, ValueError):  # not Python source (an extension module): no imports
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - node.level + 1] if node.level > 1 else parts
                base = ".".join([*parts, base] if base else parts)
            if base:
                names.append(base)
                names += [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
    out = []
    for name in names:  # a dotted name imports each package above it
        parts = name.split(".")
        out += [".".join(parts[: i + 1]) for i in range(len(parts))]
    return list(dict.fromkeys(out))


def _find(name: str) -> Path | None:
    """The file of module `name` if it is the user's code: the loaded module's, else where
    the import system would find it (its parent packages are not imported either)."""
    module = sys.modules.get(name)
    if module is not None:
        return module_file(module)
    spec = _spec(name)
    origin = spec.origin if spec else None
    return Path(origin).resolve() if is_user_file(origin) else None


def _spec(name: str) -> importlib.machinery.ModuleSpec | None:
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__spec__", None)
    parent, _, _ = name.rpartition(".")
    search = None
    if parent:
        spec = _spec(parent)
        search = spec.submodule_search_locations if spec else None
        if not search:
            return None
    return importlib.machinery.PathFinder.find_spec(name, search)
