"""fp4lab's public face: one spelling per name, seen by type checkers, loaded on first use.

The face is `fp4lab/__init__.pyi` (and the stubs of `fp4lab.sweep` and `fp4lab.train`): explicit
re-exports that mypy, pyright and IDEs read, and that `fp4lab.lazy.attach_stub` turns into the
packages' lazy `__getattr__` at run time.
"""

import functools
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import fp4lab as fl
from fp4lab import lazy

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
STUBS = {
    "fp4lab": ROOT / "fp4lab" / "__init__.pyi",
    "fp4lab.sweep": ROOT / "fp4lab" / "sweep" / "__init__.pyi",
    "fp4lab.train": ROOT / "fp4lab" / "train" / "__init__.pyi",
    "fp4lab.diagnosis": ROOT / "fp4lab" / "diagnosis" / "__init__.pyi",
}
MYPY_CONFIG = """
[mypy]
follow_imports = silent
ignore_missing_imports = True
[mypy-jax.*,jaxlib.*,flax.*,optax.*,numpy.*,pandas.*,ml_dtypes.*,matplotlib.*,seaborn.*,scipy.*]
follow_imports = skip
[mypy-pyarrow.*,ray.*,rlax.*,gymnax.*,chex.*,statsmodels.*,tensorboardX.*]
follow_imports = skip
"""


def readme_script() -> str:
    """The README's python blocks, one after another, as a reader pastes them."""
    blocks = FENCE.findall((ROOT / "README.md").read_text(encoding="utf-8"))
    return "\n".join(b for b in blocks if not b.startswith("# not run"))


def test_a_type_checker_resolves_every_fl_name_of_the_readme(tmp_path):
    """mypy on the README's tour, then on every name of the face, finds each `fl.` name; a
    planted unknown name and a deprecated spelling are errors (they are not in the face)."""
    script = readme_script()
    used = set(re.findall(r"\bfl\.(\w+)", script))
    assert {"nvfp4", "quantize_model", "own", "Config"} <= used
    every = "".join(f"\nprint(fl.{name})" for name in fl.__all__)
    planted = "\nfl.not_a_name\nfl.quantize_dequantize\n"
    (tmp_path / "tour.py").write_text(script + every + planted)
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--no-incremental"]
        + ["--python-executable", sys.executable, "tour.py"],
        cwd=tmp_path,
        env={"MYPYPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    unresolved = re.findall(r'Module has no attribute "(\w+)"', result.stdout)
    assert sorted(unresolved) == ["not_a_name", "quantize_dequantize"], result.stdout
    assert used <= set(fl.__all__) | {"__version__"}


@pytest.mark.parametrize("package", sorted(STUBS))
def test_each_name_of_the_face_is_its_modules_object(package):
    module = __import__(package, fromlist=["_"])
    names = lazy.stub_names(STUBS[package])
    assert module.__all__ == sorted(names)
    for name, (source, attr) in names.items():
        assert getattr(module, name) is lazy.resolve(source, attr), name


def test_dir_lists_the_face_and_nothing_else():
    names = dir(fl)
    assert names == sorted([*fl.__all__, "__version__"])
    assert not [n for n in names if n.startswith("_") and n != "__version__"]
    for leaked in ("importlib", "attach_stub", "lazy", "_API", "_DEPRECATED"):
        assert leaked not in names


def test_import_fp4lab_loads_the_face_only():
    """`import fp4lab` adds fp4lab and its loader to what the bare interpreter has loaded, and
    nothing else (no module of the standard library either): its cost stays that of two files."""
    code = "import sys; before = set(sys.modules); import fp4lab; print(*set(sys.modules) - before)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    assert sorted(out) == ["fp4lab", "fp4lab.lazy"]


@pytest.mark.parametrize(
    "package,name,instead",
    [
        ("fp4lab", "quantize_dequantize", "fl.fake_quant"),
        ("fp4lab", "format_names", "fl.formats.format_names"),
        ("fp4lab", "get_format", "fl.formats.get_format"),
        ("fp4lab.sweep", "load", "fp4lab.load"),
    ],
)
def test_an_old_spelling_warns_and_still_works(package, name, instead):
    module = __import__(package, fromlist=["_"])
    with pytest.warns(DeprecationWarning, match=re.escape(f"{package}.{name} is deprecated: use")):
        value = getattr(module, name)
    assert callable(value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr(module, name)
    assert [instead in str(w.message) for w in caught] == [True]  # every use, naming the fix
    assert name not in dir(module) and name not in module.__all__


def test_a_stub_with_anything_but_re_exports_is_refused(tmp_path):
    stub = tmp_path / "bad.pyi"
    stub.write_text("from fp4lab.core.spec import nvfp4\n")
    with pytest.raises(ValueError, match="nvfp4 as nvfp4"):
        lazy.stub_names(stub)
    stub.write_text("def f() -> int: ...\n")
    with pytest.raises(ValueError, match="only re-exports"):
        lazy.stub_names(stub)
    with pytest.raises(AttributeError, match="module 'fp4lab' has no attribute 'nvfp5'"):
        fl.nvfp5  # noqa: B018


@functools.cache
def _shadowed() -> dict[str, list[str]]:
    """{package: the face's names that are not the face's object} in one fresh process, after
    every module behind every face was imported (as the CLI or a user's `import fp4lab.x.y`
    does)."""
    stubs = {package: str(path) for package, path in STUBS.items()}
    code = f"""
import importlib, json, pathlib
from fp4lab import lazy
names = {{p: lazy.stub_names(pathlib.Path(stub)) for p, stub in {stubs!r}.items()}}
for each in names.values():
    for module, _ in each.values():
        importlib.import_module(module)
bad = {{
    p: [n for n, src in each.items()
        if getattr(importlib.import_module(p), n) is not lazy.resolve(*src)]
    for p, each in names.items()
}}
print(json.dumps(bad))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    return json.loads(out.stdout)


@pytest.mark.parametrize("package", sorted(STUBS))
def test_a_face_name_is_never_shadowed_by_a_submodule(package):
    """Each name is still the face's object once every module behind the face is imported: no
    function shares its name with a submodule of its package, which the import system would
    bind over it."""
    bad = _shadowed()[package]
    assert bad == [], f"shadowed by a submodule: {bad}"
