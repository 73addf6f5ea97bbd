"""The README runs as written.

Every ```python block runs top to bottom in one fresh interpreter, the way a reader pastes
them one after another; a failure names the block and the README line. Shell blocks call the
tools of the project's virtual environment as `.venv/bin/...`, or activate it first.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)

# Commands installed into the virtual environment by `pip install -e ".[dev]"` and the extras.
VENV_COMMANDS = ("fp4lab", "pip", "jupyter", "ray", "pytest", "lint-imports")
ACTIVATE = re.compile(r"^\s*(source|\.)\s+\S*\.venv/bin/activate\b", re.MULTILINE)

# Runs the blocks in one namespace, in order; on an error prints the block and exits 1.
RUNNER = """
import ast, json, sys, traceback
readme, blocks = sys.argv[1], json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
for number, line, source in blocks:
    try:
        tree = ast.increment_lineno(ast.parse(source), line - 1)
        exec(compile(tree, readme, "exec"), namespace)
    except BaseException:
        print(f"README python block {number} (line {line}) failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def blocks(*languages: str) -> list[tuple[int, int, str]]:
    """(number among blocks of these languages, README line of the first code line, code)."""
    text = README.read_text()
    found = []
    for match in FENCE.finditer(text):
        if match.group(1) in languages:
            line = text.count("\n", 0, match.start(2)) + 1
            found.append((len(found) + 1, line, match.group(2)))
    return found


def bare_venv_commands(script: str) -> list[str]:
    """Lines of a shell block that call a command of the venv by its bare name."""
    bare = []
    for line in script.splitlines():
        code = re.sub(r"(^|\s)#.*", "", line)  # drop comments
        for command in re.split(r"&&|\|\||[;|]|\$\(", code):
            words = [w for w in command.split() if not re.fullmatch(r"\w+=\S*", w)]
            if words and words[0] in VENV_COMMANDS:
                bare.append(line.strip())
                break
    return bare


def snippet_env() -> dict[str, str]:
    """The environment of the blocks' interpreter: CPU, no windows, and fast compiles.

    Outside jit, jax compiles every operation on first use (a few hundred small programs for
    one quantizer call), so the blocks spend their time in XLA's compiler: it runs without
    LLVM optimization here (XLA_FLAGS as conftest.py sets it for every test), and the compiled
    programs go to the tests' compilation cache.
    """
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg"}
    cache = jax.config.jax_compilation_cache_dir  # set by conftest.py unless turned off
    if cache:
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    return env


@pytest.mark.slow  # a subprocess: about 15-25 s of compiles on one core
def test_python_blocks_run_top_to_bottom_in_one_interpreter(tmp_path):
    code = blocks("python")
    assert code, "README.md has no python blocks"
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, str(README)],
        input=json.dumps(code),
        capture_output=True,
        text=True,
        cwd=tmp_path,  # whatever a block writes lands here, not in the checkout
        env=snippet_env(),
        timeout=300,
    )
    if result.returncode != 0:
        pytest.fail(result.stderr[-4000:], pytrace=False)


def test_a_failing_block_is_named_with_its_line_and_error():
    code = [(1, 3, "a = 1"), (2, 10, "b = a\nc = b + undefined")]
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, "README.md"],
        input=json.dumps(code),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "README python block 2 (line 10) failed" in result.stderr
    assert 'File "README.md", line 11' in result.stderr
    assert "NameError: name 'undefined' is not defined" in result.stderr


def test_shell_blocks_use_the_virtual_environment():
    shell = blocks("bash", "sh", "shell", "console")
    assert shell, "README.md has no shell blocks"
    offending = [
        f"shell block {number} (line {line}): {cmd}"
        for number, line, script in shell
        if not ACTIVATE.search(script)
        for cmd in bare_venv_commands(script)
    ]
    assert not offending, (
        "call these as .venv/bin/<command> or activate the venv in the block:\n"
        + "\n".join(offending)
    )


def test_bare_command_check_finds_what_it_should():
    assert bare_venv_commands("fp4lab run x.py  # runs") == ["fp4lab run x.py  # runs"]
    assert bare_venv_commands("cd a && pip install -e .") == ["cd a && pip install -e ."]
    assert bare_venv_commands("X=1 fp4lab ls results") == ["X=1 fp4lab ls results"]
    assert not bare_venv_commands(".venv/bin/fp4lab run x.py   # not fp4lab run")
    assert not bare_venv_commands('python3 -m venv .venv && .venv/bin/pip install -e ".[dev]"')
    assert ACTIVATE.search("source .venv/bin/activate\nfp4lab ls results")
