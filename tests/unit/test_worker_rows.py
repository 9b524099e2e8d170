"""The claim's worker row kept by the writer (coordd.store.sqlite.job_changes.WorkerRows):
never older than the stored row. A write by the writer drops it (TEMP triggers), a
rolled-back write leaves nothing of it behind, a commit by another connection makes the
next batch read it again; a claim + complete with the next claim reads it once."""

from __future__ import annotations

import sqlite3

import pytest

from coordd.rules import gates
from coordd.wire.claims import ClaimAsk
from coordd.wire.protocol import Complete
from tests.conftest import T0

STALE = "UPDATE workers SET heartbeat_at = heartbeat_at - 1000 WHERE worker_id = ?"


async def test_the_next_claim_reads_the_worker_row_once(bundle):
    await bundle.worker("w")
    for _ in range(3):
        await bundle.enqueue()
    got = await bundle.claim("w")
    traced: list[str] = []
    bundle.coord.store.writer._conn.set_trace_callback(traced.append)
    try:
        for _ in range(2):
            got = (await bundle.coord.complete(Complete(
                job_id=got.job.job_id, worker_id="w", token=got.lease.token, result={},
                next=ClaimAsk(lease_s=30.0)))).next
            assert got.job is not None
    finally:
        bundle.coord.store.writer._conn.set_trace_callback(None)
    assert not [s for s in traced if s.startswith("SELECT roles_json")]


async def test_a_heartbeat_that_changes_the_readings_is_seen_by_the_next_claim(bundle):
    await bundle.worker("w")
    await bundle.enqueue()
    assert (await bundle.claim("w", kinds=["none"])).job is None  # the row is kept now
    await bundle.worker("w", temperature_c=99.0)
    got = await bundle.claim("w")
    assert got.job is None and gates.TOO_HOT in got.reasons


async def test_a_rolled_back_write_leaves_no_row_behind(bundle):
    await bundle.worker("w")
    await bundle.enqueue()
    rows = bundle.coord.store.writer.changes.worker_rows

    def fails_after_writing(conn: sqlite3.Connection, now: float) -> None:
        conn.execute(STALE, ("w",))
        assert rows.get(conn, "w")[2] == T0 - 1000  # kept inside the transaction
        raise RuntimeError("the op fails after its write")

    with pytest.raises(Exception, match="fails after its write"):
        await bundle.coord.store.writer.run(fails_after_writing)
    got = await bundle.claim("w")
    assert got.job is not None, got.reasons  # the stored time is T0: live


async def test_another_connections_commit_is_seen(bundle):
    await bundle.worker("w")
    await bundle.enqueue()
    assert (await bundle.claim("w", kinds=["none"])).job is None  # the row is kept now
    conn = sqlite3.connect(bundle.db_path, isolation_level=None)
    try:
        conn.execute(STALE, ("w",))
    finally:
        conn.close()
    got = await bundle.claim("w")
    assert got.job is None and got.reasons == [gates.HEARTBEAT_STALE]
