"""The claim's look at preemption reservations is skipped while none can exist
(coordd.rules.preemption.ReservationHint), and a reservation is never missed: not after
preemption stores one, not after a rollback brings one back, not after another
connection wrote one. Pinned clock, real SQLite."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from coordd.store.sqlite import job_changes
from coordd.wire.protocol import Claim, Complete, Heartbeat
from coordd.wire.workers import Release
from tests.conftest import COOL

ONE_SLOT = {"slots_total": 1, "slots": {"k": 1}}


async def beat(b, worker_id="w1"):
    return await b.coord.heartbeat(Heartbeat(worker_id=worker_id, roles=["cpu"],
                                             readings={**COOL, **ONE_SLOT}))


async def reserved_for_w1(b):
    """w1 ran a P3 job that a P1 job preempted and released it: w1's slot is reserved
    for the P1 job, and a P0 job (better in claim order) waits too. (p1, p0)."""
    await beat(b)
    await b.enqueue(priority=3)
    c = await b.claim("w1", lease_s=300)
    p1 = await b.enqueue(priority=1)
    await beat(b)  # preempt: vacate the P3 run, reserve w1's slot for the P1 job
    await b.coord.release(Release(job_id=c.job.job_id, worker_id="w1", token=c.lease.token,
                                  reason="vacated: preempted"))
    p0 = await b.enqueue(priority=0)
    await beat(b, "w2")
    return p1, p0


async def test_claims_skip_the_reservations_lookup_while_none_can_exist(bundle):
    await bundle.worker("w1")
    for _ in range(4):
        await bundle.enqueue()
    seen: list[str] = []
    bundle.coord.store.writer._conn.set_trace_callback(seen.append)
    try:
        for _ in range(4):
            got = await bundle.claim("w1")
            await bundle.coord.complete(Complete(job_id=got.job.job_id, worker_id="w1",
                                                 token=got.lease.token, result={}))
    finally:
        bundle.coord.store.writer._conn.set_trace_callback(None)
    looks = [s for s in seen if "reservations" in s]
    assert len(looks) == 2, looks  # the first claim's look and its "is the table empty?"
    assert not bundle.coord.governance.preemptor.hint.maybe


async def test_a_reservation_made_after_the_hint_dropped_is_taken(make_bundle):
    b = await make_bundle(preempt_min_runtime_s=0, reservation_s=60)
    p1, p0 = await reserved_for_w1(b)  # the first claim found no reservation: hint down
    assert (await b.claim("w1")).job.job_id == p1
    assert (await b.claim("w2")).job.job_id == p0


async def test_a_failed_batch_brings_the_reservation_and_the_hint_back(make_bundle,
                                                                       monkeypatch):
    b = await make_bundle(preempt_min_runtime_s=0, reservation_s=60)
    p1, p0 = await reserved_for_w1(b)
    writer = b.coord.store.writer

    def broken_flush(conn: sqlite3.Connection) -> None:
        job_changes.JobChanges.flush(writer.changes, conn)
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(writer.changes, "flush", broken_flush)
    # one batch: w1 takes the reserved job (deleting the reservation), then w2's claim
    # finds the table empty and drops the hint; the batch's COMMIT never happens
    got = await asyncio.gather(b.coord.claim(Claim(worker_id="w1", lease_s=30.0)),
                               b.coord.claim(Claim(worker_id="w2", lease_s=30.0)),
                               return_exceptions=True)
    assert all(isinstance(g, Exception) for g in got), got
    monkeypatch.undo()
    assert (await b.claim("w1")).job.job_id == p1  # the reservation is back, and seen
    assert (await b.claim("w2")).job.job_id == p0


async def test_an_op_rolled_back_brings_the_reservation_and_the_hint_back(make_bundle):
    b = await make_bundle(preempt_min_runtime_s=0, reservation_s=60)
    p1, _p0 = await reserved_for_w1(b)
    policy = b.coord._claim_policy

    def drop_then_fail(conn: sqlite3.Connection, now: float) -> None:
        conn.execute("DELETE FROM reservations")
        from coordd.store.sqlite import leases
        leases.claim(conn, now, "w2", 30.0, None, policy)  # finds none: hint down
        assert not policy.reservations.maybe
        raise RuntimeError("boom after a write")  # the whole op is rolled back

    with pytest.raises(Exception, match="boom"):
        await b.coord.store.writer.run(drop_then_fail)
    assert (await b.claim("w1")).job.job_id == p1


async def test_a_reservation_written_by_another_connection_is_taken(bundle):
    await bundle.worker("w1")
    assert (await bundle.claim("w1")).job is None  # the look found none: hint down
    assert not bundle.coord.governance.preemptor.hint.maybe
    p1 = await bundle.enqueue(priority=1)
    await bundle.enqueue(priority=0)
    other = sqlite3.connect(bundle.db_path, isolation_level=None)
    other.execute("INSERT INTO reservations (job_id, worker_id, victim_job_id, created_at, "
                  "expires_at) VALUES (?, 'w1', 'gone', ?, ?)",
                  (p1, bundle.clock.wall(), bundle.clock.wall() + 60))
    other.close()
    assert (await bundle.claim("w1")).job.job_id == p1
