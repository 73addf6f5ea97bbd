"""A package face that type checkers see and that imports nothing until a name is used.

A package lists its public names once, in its `__init__.pyi` stub, as explicit re-exports
(`from fp4lab.core.spec import nvfp4 as nvfp4`, `from fp4lab.core import formats as formats`).
Type checkers and IDEs read the stub; at run time `attach_stub` reads the same lines and loads
each name from its module on first use (PEP 562), so `import fp4lab` loads no jax and a worker
process loads only what it runs. The design is scientific-python's `lazy_loader.attach_stub`,
in the few lines fp4lab needs.

Old spellings kept for a release are passed as `deprecated`: each warns with a
DeprecationWarning that names the one spelling to use, and then resolves as before.
"""

from __future__ import annotations

import ast
import importlib
import warnings
from collections.abc import Callable
from pathlib import Path


def stub_names(stub: Path) -> dict[str, tuple[str, str]]:
    """{public name: (module, attribute)} of the `from M import a as a` lines of a stub.

    Only explicit re-exports count (`as` with the same name, the stub convention); relative
    imports are not used in fp4lab's stubs and are refused, as is any other statement kind
    except docstrings, `__all__` and `__version__`.
    """
    names: dict[str, tuple[str, str]] = {}
    for node in ast.parse(stub.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom):
            if node.level or node.module is None:
                raise ValueError(f"{stub}: use absolute imports ({ast.unparse(node)})")
            for alias in node.names:
                if alias.asname != alias.name:
                    raise ValueError(f"{stub}: re-export as `{alias.name} as {alias.name}`")
                names[alias.name] = (node.module, alias.name)
        elif not isinstance(node, ast.Expr | ast.Assign | ast.AnnAssign):
            raise ValueError(f"{stub}:{node.lineno}: only re-exports belong in a package stub")
    return names


def resolve(module: str, attr: str):
    """`module.attr`: the submodule of that name where there is one, else the attribute.

    The submodule is tried first: a package's own attribute lookup may be this very loader.
    """
    try:
        return importlib.import_module(f"{module}.{attr}")
    except ModuleNotFoundError as e:
        if e.name != f"{module}.{attr}":
            raise  # the submodule exists but imports something missing
    return getattr(importlib.import_module(module), attr)


def attach_stub(
    package: str, init_file: str, deprecated: dict[str, tuple[str, str, str]] | None = None
) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """`__getattr__`, `__dir__` and `__all__` for the package `package` from its stub.

    Args:
      package: the package's `__name__`.
      init_file: its `__file__`; the stub is the `.pyi` beside it.
      deprecated: {old name: (module, attribute, the spelling to use instead)}: resolved with a
        DeprecationWarning on every use, never listed in `__all__` or `dir()`.

    Returns:
      (__getattr__, __dir__, __all__), to assign in the package's `__init__`.
    """
    names = stub_names(Path(init_file).with_suffix(".pyi"))
    deprecated = deprecated or {}
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str):
        if name in names:
            value = resolve(*names[name])
            namespace[name] = value  # later look-ups skip this function
            return value
        if name in deprecated:
            module, attr, instead = deprecated[name]
            warnings.warn(
                f"{package}.{name} is deprecated: use {instead}", DeprecationWarning, stacklevel=2
            )
            return resolve(module, attr)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted([*names, *(n for n in ("__version__",) if n in namespace)])

    return __getattr__, __dir__, sorted(names)
