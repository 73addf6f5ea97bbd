"""The command line on bad input: one clear line on stderr, exit status 2, nothing run."""

import os
import textwrap

import pytest

from fp4lab import cli

CONFIG = """
from fp4lab.train.config import Config

def get_config():
    {body}
"""


def write(tmp_path, text: str, name="exp.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_get_config_raising_is_one_line(tmp_path, capsys):
    path = write(tmp_path, CONFIG.format(body="return 1 / 0") + "\ndef sweep(add):\n    add()\n")
    assert cli.main(["run", str(path), "--out", str(tmp_path / "o")]) == 2
    line = one_error_line(capsys)
    assert "exp.py: get_config() raised ZeroDivisionError: division by zero" in line
    assert not (tmp_path / "o").exists()


def test_a_file_without_sweep_is_told_it_needs_sweep(tmp_path, capsys):
    path = write(tmp_path, CONFIG.format(body="return Config()"))
    assert cli.main(["run", str(path)]) == 2
    assert "defines no sweep(); an experiment needs get_config() and sweep(add)" in (
        one_error_line(capsys)
    )


def test_add_line_is_named_for_a_relative_path(tmp_path, capsys, monkeypatch):
    text = CONFIG.format(body="return Config()") + "\ndef sweep(add):\n    add(lr=-1.0)\n"
    write(tmp_path, text)
    monkeypatch.chdir(tmp_path)
    line_no = text.splitlines().index("    add(lr=-1.0)") + 1
    assert cli.main(["run", "exp.py", "--out", "o"]) == 2
    assert f"exp.py:{line_no}: cell lr=-1.0: Config.lr=-1.0" in one_error_line(capsys)


def test_show_of_a_file_and_of_a_missing_folder(tmp_path, capsys):
    (tmp_path / "r.json").write_text("{}")
    assert cli.main(["show", str(tmp_path / "r.json")]) == 2
    assert "r.json is a file" in one_error_line(capsys)
    assert cli.main(["show", str(tmp_path / "nope")]) == 2
    assert "no results folder" in one_error_line(capsys)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_one_line(tmp_path, capsys):
    path = write(tmp_path, CONFIG.format(body="return Config()") + "\ndef sweep(add):\n    add()\n")
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        assert cli.main(["run", str(path), "--out", str(out), "--quiet"]) == 2
    finally:
        out.chmod(0o755)
    assert "cannot write" in one_error_line(capsys)
