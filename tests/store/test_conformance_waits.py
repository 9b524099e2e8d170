"""The parked calls' reads over both stores (coordd.store.api_waits): a job's status, a
worker's pending actions, the event feed after a cursor, the jobs not yet due; the same
answers from SQLite and PostgreSQL, `now` pinned."""

from __future__ import annotations

import pytest

from coordd.store.api import LeaseRef
from tests.store.conftest import T0
from tests.store.test_conformance_governance import HOT, beat, gov


async def test_job_status_follows_the_job(bundle):
    b = bundle
    assert await b.store.job_status("nosuch") is None
    job = await b.enqueue()
    assert await b.store.job_status(job) == "waiting"
    await b.worker("w1")
    got = await b.claim("w1", now=T0)
    assert await b.store.job_status(job) == "running"
    await b.store.complete(LeaseRef(job, "w1", got.lease.token), "1", now=T0 + 1)
    assert await b.store.job_status(job) == "succeeded"


async def test_worker_actions_list_cancels_and_governed_leases(bundle):
    b, g = bundle, gov()
    assert (await b.store.worker_actions("a")) == (await b.store.worker_actions("nobody"))
    hot = await b.enqueue(priority=3)
    await beat(b, g, "a", T0)
    await b.claim("a", now=T0 + 1, lease_s=300.0)
    cancelled = await b.enqueue(priority=0)
    await b.claim("a", now=T0 + 1, lease_s=300.0)
    other = await b.enqueue(priority=0)
    await beat(b, g, "b", T0)
    await b.claim("b", now=T0 + 1, lease_s=300.0)
    await b.store.cancel(cancelled, now=T0 + 2)
    await b.store.cancel(other, now=T0 + 2)
    await beat(b, g, "a", T0 + 3, HOT)  # suspends the P3 run
    acts = await b.store.worker_actions("a")
    assert (acts.cancel, acts.suspend, acts.vacate, acts.resume) == ([cancelled], [hot], [], [])
    assert acts.reasons == {hot: "too_hot"}
    assert (await b.store.worker_actions("b")).cancel == [other]


async def test_the_feed_lists_events_after_a_cursor_with_their_jobs(bundle):
    b = bundle
    assert await b.store.feed(0, 100, now=T0) == [] and await b.store.last_event_id() == 0
    job = await b.enqueue(kind="embed")
    await b.worker("w1")
    got = await b.claim("w1", now=T0 + 1)
    await b.store.complete(LeaseRef(job, "w1", got.lease.token), "1", now=T0 + 2)
    events = await b.store.feed(0, 100, now=T0 + 3)
    assert [(e.job_id, e.from_status, e.to_status, e.worker_id, e.kind, e.workflow_id)
            for e in events] == [(job, None, "waiting", None, "embed", None),
                                 (job, "waiting", "running", "w1", "embed", None),
                                 (job, "running", "succeeded", "w1", "embed", None)]
    assert [e.at for e in events] == [T0, T0 + 1, T0 + 2]
    ids = [e.event_id for e in events]
    assert ids == sorted(ids) and await b.store.last_event_id() == ids[-1]
    assert await b.store.feed(ids[0], 1, now=T0 + 3) == events[1:2]
    assert await b.store.feed(ids[-1], 100, now=T0 + 3) == []


async def test_scheduled_jobs_are_the_waiting_ones_not_yet_due(bundle):
    b = bundle
    await b.enqueue(kind="now")
    await b.enqueue(kind="later", role="gpu", run_at=T0 + 60)
    assert await b.store.scheduled_jobs(now=T0) == [(T0 + 60, "gpu", "later")]
    assert await b.store.scheduled_jobs(now=T0 + 60) == []


async def test_postgres_feed_holds_back_an_event_id_that_may_still_commit(bundle, request):
    """Event ids commit out of order on PostgreSQL: the feed stops before a gap until the
    gap is old, so a reader by cursor never steps past an event committed later."""
    b = bundle
    if b.kind != "postgres":
        pytest.skip("SQLite: one writer commits event ids in order")
    import asyncpg
    first = await b.enqueue(now=T0)
    conn = await asyncpg.connect(request.getfixturevalue("pg_dsn"))
    try:
        tx = conn.transaction()
        await tx.start()
        await conn.execute("INSERT INTO job_events (job_id, at, to_status) "
                           "VALUES ($1, $2, 'waiting')", first, T0 + 1)  # not committed
        second = await b.enqueue(now=T0 + 1)
        seen = await b.store.feed(0, 100, now=T0 + 2)
        assert [e.job_id for e in seen] == [first]  # held back before the open id
        await tx.rollback()  # the gap stays for good
        assert [e.job_id for e in await b.store.feed(0, 100, now=T0 + 2)] == [first]
        later = await b.store.feed(seen[-1].event_id, 100, now=T0 + 1 + 5.0)
        assert [e.job_id for e in later] == [second]  # a settled gap is passed
    finally:
        await conn.close()
