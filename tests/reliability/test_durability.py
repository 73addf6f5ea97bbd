"""Durability of what is written: each rename into a results folder is followed by an fsync of
the folder, and a write that fails (a full disk) leaves no temporary file behind, the report's
included."""

import errno
import os
import stat

import pytest

from fp4lab import cli
from fp4lab.analysis import report
from fp4lab.sweep import records


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_the_folder_is_fsynced_after_each_rename(tmp_path, monkeypatch):
    calls = []
    replace, fsync = os.replace, os.fsync

    def logged_replace(src, dst):
        replace(src, dst)
        calls.append(("rename", os.path.dirname(dst)))

    def logged_fsync(fd):
        st = os.fstat(fd)
        calls.append(("fsync", (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else "file"))
        fsync(fd)

    monkeypatch.setattr(os, "replace", logged_replace)
    monkeypatch.setattr(os, "fsync", logged_fsync)
    folder = tmp_path / "res" / "runs"
    records.write_atomic(folder / "a.json", "{}")
    records.write_atomic(folder / "b.json", "{}")
    st = folder.stat()
    renames = [i for i, c in enumerate(calls) if c[0] == "rename"]
    assert len(renames) == 2
    for i in renames:  # the next flush after each rename is the folder's
        assert calls[i + 1] == ("fsync", (st.st_dev, st.st_ino)), calls


@pytest.mark.parametrize("fails", ["fsync", "replace"])
def test_a_report_on_a_full_disk_leaves_no_temporary_file(
    tmp_path, monkeypatch, capsys, experiment_file, run_sweep, fails
):
    out = tmp_path / "res"
    run_sweep(experiment_file(), out)
    before = set(out.iterdir())
    monkeypatch.setattr(os, fails, no_space)
    assert cli.main(["report", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left" in err[0], err
    # no report.html, no report.html.tmp (the index's SQLite -wal/-shm files come and go with
    # its readers' connections, which garbage collection may close later: not the report's)
    sidecars = {"index.sqlite-wal", "index.sqlite-shm"}
    assert {p for p in out.iterdir() if p.name not in sidecars} == before - {
        p for p in before if p.name in sidecars
    }


def test_a_record_on_a_full_disk_leaves_no_temporary_file(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(records.StoreError, match="no space left"):
        records.write_atomic(tmp_path / "a.json", "{}")
    assert list(tmp_path.iterdir()) == []


def test_write_report_removes_its_temporary_file_on_any_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "render", lambda results: "<html></html>")
    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(OSError):
        report.write_report(None, tmp_path)
    assert list(tmp_path.iterdir()) == []
