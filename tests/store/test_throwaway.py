"""The throwaway cluster's binary lookup: where PostgreSQL is missing, a clear reason
(tests/store/conftest.py skips with it) instead of a failing subprocess."""

from __future__ import annotations

import pytest

from coordd.store.postgres import throwaway


def test_missing_binaries_give_a_clear_reason(monkeypatch):
    monkeypatch.setattr(throwaway.glob, "glob", lambda _pattern: [])
    monkeypatch.setattr(throwaway.shutil, "which", lambda _name: None)
    assert throwaway.binaries() is None
    with pytest.raises(RuntimeError, match="PostgreSQL binaries not found"):
        throwaway.Cluster().start()


def test_the_newest_version_is_taken(monkeypatch, tmp_path):
    for v in ("9", "15", "13"):
        (tmp_path / v / "bin").mkdir(parents=True)
        (tmp_path / v / "bin" / "initdb").write_text("")
        (tmp_path / v / "bin" / "initdb").chmod(0o755)
    monkeypatch.setattr(throwaway.glob, "glob",
                        lambda _p: [str(tmp_path / v / "bin") for v in ("9", "15", "13")])
    assert throwaway.binaries() == tmp_path / "15" / "bin"
