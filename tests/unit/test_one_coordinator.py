"""Issue 27: `coordd --db PATH` and `coordd --store postgresql://...` build the same daemon
class and the same Coordinator type; only the store differs. Nothing is started (the
daemon's `run` is replaced), so no PostgreSQL server is needed."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from coordd import __main__ as cli
from coordd.daemon import server
from coordd.service import Coordinator
from coordd.store.sqlite.store import SQLiteStore


def test_db_and_store_build_the_same_coordinator_over_different_stores(tmp_path, monkeypatch):
    pytest.importorskip("asyncpg", reason="asyncpg is not installed")
    from coordd.store.postgres import PostgresStore
    built: list[Any] = []

    async def run(self: server.Daemon) -> None:  # instead of serving: note what was built
        built.append(self)
    monkeypatch.setattr(server.Daemon, "run", run)
    sock = str(tmp_path / "c.sock")
    assert cli.main(["--db", str(tmp_path / "c.db"), "--socket", sock]) == 0
    assert cli.main(["--store", "postgresql://coordd@/coordd?host=/nonexistent",
                     "--socket", sock]) == 0
    on_sqlite, on_pg = built
    assert type(on_sqlite) is type(on_pg) is server.Daemon
    assert type(on_sqlite.coord) is type(on_pg.coord) is Coordinator
    assert isinstance(on_sqlite.coord.store, SQLiteStore)
    assert isinstance(on_pg.coord.store, PostgresStore)
    assert on_sqlite.coord.store.path == str((tmp_path / "c.db").resolve())


def test_no_second_coordinator_remains():
    for gone in ("coordd.store_daemon", "coordd.store_service",
                 "coordd.store_service_governance", "coordd.store_service_workflows"):
        assert importlib.util.find_spec(gone) is None, gone
