"""The v19 -> v20 migration (leases WITHOUT ROWID, coordd.store.schema): a database
written by a v19 coordd with a live lease holding a limit unit keeps the lease, its
fencing token and its hold; the limits' release trigger is there again, so the report
that ends the lease frees the unit; a stale token is still refused."""

from __future__ import annotations

import random
import sqlite3

import pytest

from coordd import config as config_mod
from coordd import errors, store
from coordd.clock import FakeClock
from coordd.daemon.server import sqlite_coordinator
from coordd.store import schema
from coordd.wire.limits import LimitSet
from coordd.wire.protocol import Complete, JobId
from tests.conftest import T0, Bundle

V19 = 19
LEASES_SQL = "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'leases'"


async def test_a_live_lease_and_its_limit_hold_survive_the_rebuild(tmp_path, monkeypatch):
    path = str(tmp_path / "v19.db")
    with monkeypatch.context() as m:  # a coordd that stops at v19
        m.setattr(store, "migrate", lambda conn: schema.migrate(conn, V19))
        coord = sqlite_coordinator(path, config_mod.load(None), FakeClock(T0),
                                   rng=random.Random(1))
        await coord.start()
        b = Bundle(coord, FakeClock(T0), path)
        try:
            await coord.limits_set(LimitSet(name="api", settings={"concurrency": 1}))
            await b.worker("w")
            job_id = await b.enqueue(limits=["api"])
            got = await b.claim("w")
            assert got.job is not None and got.job.job_id == job_id
        finally:
            await coord.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == V19
    assert "WITHOUT ROWID" not in conn.execute(LEASES_SQL).fetchone()[0]
    conn.close()

    coord = sqlite_coordinator(path, config_mod.load(None), FakeClock(T0 + 1),
                               rng=random.Random(1))
    await coord.start()
    try:
        assert (await coord.check()) == {"quick_check": "ok", "foreign_key_violations": 0,
                                         "invariants": []}
        view = await coord.get_job(JobId(job_id=job_id))
        assert view.lease is not None and view.lease.worker_id == "w"
        assert view.lease.token == got.lease.token
        holds = "SELECT count(*) FROM limit_holds"
        assert await coord.store.readers.run(lambda c: c.execute(holds).fetchone()[0]) == 1
        with pytest.raises(errors.CoordError):  # fencing: an older token is refused
            await coord.complete(Complete(job_id=job_id, worker_id="w",
                                          token=got.lease.token - 1, result={}))
        await coord.complete(Complete(job_id=job_id, worker_id="w", token=got.lease.token,
                                      result={"ok": 1}))
        assert (await coord.get_job(JobId(job_id=job_id))).status == "succeeded"
        assert await coord.store.readers.run(lambda c: c.execute(holds).fetchone()[0]) == 0
    finally:
        await coord.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == store.SCHEMA_VERSION
    assert "WITHOUT ROWID" in conn.execute(LEASES_SQL).fetchone()[0]
    indexes = {n for (n,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'leases'")}
    assert indexes == {"leases_expiry", "leases_worker", "leases_claim_id"}
    conn.close()


def test_a_migrated_file_starts_with_an_empty_wal(tmp_path):
    """The migrations' pages are checkpointed into the file: a new file's WAL does not keep
    the ~650 KiB its tables took (the disk-full refusals count on a WAL that grows with what
    is written: tests/integration/test_pressure_disk.py)."""
    path = tmp_path / "new.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        assert schema.migrate(conn) == schema.SCHEMA_VERSION
        assert (tmp_path / "new.db-wal").stat().st_size == 0
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
    finally:
        conn.close()
