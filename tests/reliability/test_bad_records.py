"""An unreadable record is skipped with one warning whatever its content: a file nested deeper
than Python's parser goes no longer takes `ls`, `show`, `load` and `run` of the folder down."""

import warnings

import pytest

import fp4lab as fl
from fp4lab import cli
from fp4lab.sweep import records

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("where", ["runs/0123456789abcdef.json", "experiment.json"])
def test_a_deeply_nested_file_is_a_bad_entry_not_a_crash(
    tmp_path, capsys, experiment_file, run_sweep, where
):
    out = tmp_path / "res"
    path = experiment_file()
    run_sweep(path, out)
    culprit = out / where
    culprit.write_text(DEEP)
    with pytest.warns(records.CorruptRecord, match="nested too deeply"):
        results = fl.load(out)
        assert cli.main(["ls", str(out)]) == 0
        assert cli.main(["show", str(out)]) == 0
    assert len(results.runs) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", records.CorruptRecord)
        counts = run_sweep(path, out)
    assert counts["done"] + counts["skipped"] == 2
    assert "RecursionError" not in capsys.readouterr().err


def test_a_record_that_cannot_be_checked_is_skipped(tmp_path, monkeypatch):
    path = tmp_path / "0123456789abcdef.json"
    path.write_text('{"checksum": "0", "run_id": "0123456789abcdef"}')

    def deep(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(records, "canonical", deep)
    with pytest.warns(records.CorruptRecord, match="cannot be checked"):
        assert records.read_record(path) is None
