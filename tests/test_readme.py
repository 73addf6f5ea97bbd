"""The README and the guide run as written, and print what they show.

Every ```python block of README.md runs top to bottom in one fresh interpreter, the way a reader
pastes them one after another; docs/guide.md's blocks do the same in another. A failure names
the block and its line. The outputs a document shows are compared with what the code prints:

- comment lines right after a top-level `print(...)` statement (`# ` then the text) are that
  statement's output, line for line;
- a ```text block right after a ```python block (nothing but blank lines between) is all that
  the python block prints.

Trailing spaces and trailing blank lines are ignored. A python block whose first line is
`# not run: <why>` is not run (a GPU, a cluster). Shell blocks call the tools of the project's
virtual environment as `.venv/bin/...`, or activate it first.
"""

import ast
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
GUIDE = ROOT / "docs" / "guide.md"
DOCUMENTS = (README, GUIDE)

FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
NOT_RUN = re.compile(r"\A# not run: *(.*)")

# Commands installed into the virtual environment by `pip install -e ".[dev]"` and the extras.
VENV_COMMANDS = ("fp4lab", "pip", "jupyter", "ray", "pytest", "lint-imports")
ACTIVATE = re.compile(r"^\s*(source|\.)\s+\S*\.venv/bin/activate\b", re.MULTILINE)

# Runs the blocks in one namespace, in order, one top-level statement at a time, and writes
# [block, first line, last line, what the statement printed] for each to the file argv[2]; on
# an error prints the block and exits 1.
RUNNER = """
import ast, contextlib, io, json, pathlib, sys, traceback
path, out = sys.argv[1], sys.argv[2]
blocks, name = json.loads(sys.stdin.read()), pathlib.Path(path).stem
namespace, printed = {"__name__": "__main__"}, []
for number, line, source in blocks:
    try:
        tree = ast.increment_lineno(ast.parse(source), line - 1)
        for statement in tree.body:
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                exec(compile(ast.Module([statement], []), path, "exec"), namespace)
            printed.append([number, statement.lineno, statement.end_lineno, buffer.getvalue()])
    except BaseException:
        print(f"{name} python block {number} (line {line}) failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
pathlib.Path(out).write_text(json.dumps(printed))
"""


def fences(document: Path) -> list[tuple[str, int, int, str]]:
    """(language, line of the first code line, line after the closing fence, code)."""
    text = document.read_text()
    found = []
    for match in FENCE.finditer(text):
        first = text.count("\n", 0, match.start(2)) + 1
        found.append((match.group(1), first, text.count("\n", 0, match.end()) + 1, match.group(2)))
    return found


def blocks(*languages: str, document: Path = README) -> list[tuple[int, int, str]]:
    """(number among blocks of these languages, line of the first code line, code)."""
    found = []
    for language, line, _, code in fences(document):
        if language in languages:
            found.append((len(found) + 1, line, code))
    return found


def runnable(document: Path) -> list[tuple[int, int, str]]:
    """The python blocks that run: all but those marked `# not run: <why>`."""
    return [b for b in blocks("python", document=document) if not NOT_RUN.match(b[2])]


def _clean(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def expected_outputs(document: Path) -> list[tuple[int, int, int, str]]:
    """What the document shows a block print: (block, first line, last line, text).

    A statement's output spans its own lines (first = last = the `print` statement's first and
    last line); a block's whole output spans the block (first = last = 0).
    """
    expected, number, last_python = [], 0, None
    for language, line, end, code in fences(document):
        if language == "python":
            number += 1
            last_python = (number, end, code)
            if NOT_RUN.match(code):
                continue
            lines = code.splitlines()
            for statement in ast.parse(code).body:
                call = statement.value if isinstance(statement, ast.Expr) else None
                if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "print"):
                    continue
                shown = []
                for text in lines[statement.end_lineno :]:
                    if not (text == "#" or text.startswith("# ")):
                        break
                    shown.append(text[2:])
                if shown:
                    first, last = line + statement.lineno - 1, line + statement.end_lineno - 1
                    expected.append((number, first, last, "\n".join(shown)))
        elif language == "text" and last_python is not None:
            number_before, after, _ = last_python
            between = document.read_text().splitlines()[after : line - 2]
            if not any(s.strip() for s in between):
                expected.append((number_before, 0, 0, code))
        if language != "python":
            last_python = None
    return expected


def mismatches(expected: list, printed: list, name: str) -> list[str]:
    """Each shown output that differs from what its statement or block printed."""
    wrong = []
    for number, first, last, text in expected:
        if first:
            got = [p for n, a, b, p in printed if n == number and (a, b) == (first, last)]
            where = f"{name} python block {number}, the print at line {first}"
        else:
            got = ["".join(p for n, _, _, p in printed if n == number)]
            where = f"{name} python block {number}, the text block after it"
        if not got:
            wrong.append(f"{where}: not run")
        elif _clean(got[0]) != _clean(text):
            wrong.append(f"{where} shows\n{text}\nbut prints\n{got[0]}")
    return wrong


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

    Outside jit, jax compiles every operation on first use, so the blocks spend their time in
    XLA's compiler: it runs without LLVM optimization here (XLA_FLAGS as conftest.py sets it
    for every test), and the compiled programs go to the tests' compilation cache.
    """
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg"}
    cache = jax.config.jax_compilation_cache_dir  # set by conftest.py unless turned off
    if cache:
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    return env


def run_blocks(document: Path, code: list, tmp_path: Path) -> list:
    """Runs the blocks in one fresh interpreter (cwd tmp_path); what each statement printed."""
    out = tmp_path / "printed.json"
    work = tmp_path / "work"
    work.mkdir()
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, str(document), str(out)],
        input=json.dumps(code),
        capture_output=True,
        text=True,
        cwd=work,  # whatever a block writes lands here, not in the checkout
        env=snippet_env(),
        timeout=300,
    )
    if result.returncode != 0:
        pytest.fail(result.stderr[-4000:], pytrace=False)
    return json.loads(out.read_text())


@pytest.mark.slow  # a subprocess: about 15-25 s of compiles on one core
@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: d.name)
def test_python_blocks_run_and_print_what_they_show(document, tmp_path):
    code = runnable(document)
    assert code, f"{document.name} has no python blocks to run"
    printed = run_blocks(document, code, tmp_path)
    wrong = mismatches(expected_outputs(document), printed, document.stem)
    assert not wrong, "\n\n".join(wrong)


def test_the_readme_shows_outputs_that_are_checked():
    shown = expected_outputs(README)
    assert any(first for _, first, _, _ in shown), "no print with its output in a comment"
    assert any(not first for _, first, _, _ in shown), "no text block of a block's output"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: d.name)
def test_blocks_not_run_say_why(document):
    for number, line, code in blocks("python", document=document):
        marker = NOT_RUN.match(code)
        assert not marker or marker.group(1).strip(), f"block {number} (line {line}): say why"


def test_a_failing_block_is_named_with_its_line_and_error(tmp_path):
    code = [(1, 3, "a = 1"), (2, 10, "b = a\nc = b + undefined")]
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, "README.md", str(tmp_path / "out.json")],
        input=json.dumps(code),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "README python block 2 (line 10) failed" in result.stderr
    assert 'File "README.md", line 11' in result.stderr
    assert "NameError: name 'undefined' is not defined" in result.stderr


def test_a_stale_output_fails(tmp_path):
    document = tmp_path / "doc.md"
    document.write_text(
        "```python\nx = 2\nprint(x + 1)  # three\n# 3\nprint('a')\n# b\n```\n\n"
        "```text\n3\na\n```\n\n```python\nprint('ok')\n```\n\n```text\nstale\n```\n"
    )
    code = runnable(document)
    printed = run_blocks(document, code, tmp_path)
    shown = expected_outputs(document)
    assert [(n, first) for n, first, _, _ in shown] == [(1, 3), (1, 5), (1, 0), (2, 0)]
    wrong = mismatches(shown, printed, "doc")
    assert len(wrong) == 2
    assert wrong[0].startswith("doc python block 1, the print at line 5 shows\nb\nbut prints\na")
    assert wrong[1].startswith("doc python block 2, the text block after it shows\nstale")


def test_a_block_not_run_is_left_out(tmp_path):
    document = tmp_path / "doc.md"
    document.write_text("```python\n# not run: needs a GPU\nraise SystemExit(3)\n```\n")
    assert runnable(document) == []
    assert expected_outputs(document) == []


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: d.name)
def test_shell_blocks_use_the_virtual_environment(document):
    shell = blocks("bash", "sh", "shell", "console", document=document)
    assert shell, f"{document.name} has no shell blocks"
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
