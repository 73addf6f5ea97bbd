"""The package shape: contracts that catch an upward import, no private imports, a light import.

The test command runs `lint-imports` on the tree itself before pytest (tests/run.sh); here each
contract is shown to break on an import it forbids."""

import ast
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fp4lab"
LINT = pathlib.Path(sys.executable).with_name("lint-imports")


def _fp4lab_imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fp4lab"):
            yield node


def test_no_module_imports_another_modules_private_name():
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in _fp4lab_imports(ast.parse(path.read_text())):
            found += [f"{path.name}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert found == []


def test_function_level_fp4lab_imports_are_the_deliberate_lazy_ones():
    # the cli package and package __init__ files load their layers lazily (a fast
    # `fp4lab --help` and `import fp4lab`); sweep.compute reaches the trainer only inside
    # compute_cell; sweep.provenance asks the CPU kernels (jax) only where a run id is computed,
    # never in `ls` or `show`.
    allowed = {"__init__.py", "compute.py", "provenance.py"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name in allowed or path.parent == PACKAGE / "cli":
            continue
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                found += [f"{path}:{n.lineno}" for n in _fp4lab_imports(fn)]
    assert found == []


def _lint(cwd: pathlib.Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run(
        [str(LINT), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "module,upward",
    [
        ("core/formats.py", "from fp4lab.ops import plan"),  # core -> ops
        ("ops/plan.py", "from fp4lab.nnx import rules"),  # ops -> nnx
        ("nnx/rules.py", "from fp4lab.train import trainer"),  # nnx -> train
        ("analysis/tables.py", "from fp4lab.sweep import store"),  # analysis -> sweep
        ("models/mlp.py", "from fp4lab import schema"),  # models -> fp4lab
    ],
)
def test_an_upward_import_breaks_the_contract(tmp_path, module, upward):
    shutil.copytree(PACKAGE, tmp_path / "fp4lab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "fp4lab" / module
    target.write_text(target.read_text() + f"\n{upward}  # noqa\n")
    result = _lint(tmp_path)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    return {m.split(".")[0] for m in out}


@pytest.mark.slow
def test_import_fp4lab_loads_no_plotting_pandas_or_ray():
    heavy = {"matplotlib", "seaborn", "pandas", "ray", "jax", "flax"}
    assert _loaded_after("import fp4lab") & heavy == set()


@pytest.mark.slow
def test_cli_help_loads_no_jax():
    code = "from fp4lab import cli\ntry:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass"
    assert _loaded_after(code) & {"jax", "flax", "pandas", "matplotlib", "ray"} == set()


@pytest.mark.slow
def test_a_core_name_loads_only_its_layer():
    loaded = _loaded_after("import fp4lab as fl\nfl.fake_quant")
    assert "jax" in loaded
    assert loaded & {"flax", "pandas", "matplotlib", "seaborn", "ray"} == set()
