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

import importlib
import warnings
from pathlib import Path

TYPE_CHECKING = False  # typing's constant without importing typing (type checkers know it)
if TYPE_CHECKING:  # annotations only: `import fp4lab` imports no collections.abc
    from collections.abc import Callable


def stub_names(stub: Path) -> dict[str, tuple[str, str]]:
    """{public name: (module, attribute)} of the `from M import a as a` lines of a stub.

    Only explicit re-exports count (`as` with the same name, the stub convention); relative
    imports are refused, as is any other line except the docstring, comments and annotations
    such as `__version__: str`. Read with string methods alone: `import fp4lab` imports and
    compiles nothing more than its two files.
    """
    text = stub.read_text(encoding="utf-8")
    opened = text.find('"""')
    if opened >= 0:  # the docstring, its newlines kept so that errors name the right line
        closed = text.index('"""', opened + 3) + 3
        text = text[:opened] + "\n" * text.count("\n", opened, closed) + text[closed:]
    names: dict[str, tuple[str, str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words or (words[0].endswith(":") and words[0][:-1].isidentifier()):
            continue  # blank, a comment, or an annotation such as `__version__: str`
        if words[0::2] not in (["from", "import"], ["from", "import", "as"]):
            raise ValueError(f"{stub}:{number}: only re-exports belong in a package stub")
        module, name, alias = words[1], words[3], words[5] if len(words) == 6 else None
        if module.startswith("."):
            raise ValueError(f"{stub}:{number}: use absolute imports ({' '.join(words)})")
        if alias != name:
            raise ValueError(f"{stub}:{number}: re-export as `{name} as {name}`")
        names[name] = (module, name)
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
