"""Parked calls at their edges (coordd.service.push, coordd.service.waits): a connection that
closes as its claim is granted, roles noted while nothing was parked, feed cursors past a prune
or past any rowid, the run_at timer across wall-clock steps, and a worker's re-parked watch.
Pinned clock."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from coordd import errors
from coordd.wire.protocol import Claim, Empty, Fail, Heartbeat, JobId
from coordd.wire.push import WatchEvents, WatchWorker, WorkerActions
from coordd.service.push import PARK_SCOPE, ParkScope
from coordd.service.dispatch import UNDELIVERED
from tests.conftest import COOL
from tests.unit.test_push import asleep, parked_claim, result


async def test_a_claim_granted_as_its_connection_closes_hands_the_job_back(bundle):
    """A parked claim whose connection is gone by the time its look commits a lease must
    not leave that lease to nobody (it would end only at expiry or as worker_lost,
    spending the attempt): the job goes back to waiting at once, its attempt given back."""
    await bundle.worker("w1")
    job = await bundle.enqueue(max_attempts=1)
    scope = ParkScope()
    scope.close()  # the peer went while the claim was on its way

    def in_scope():
        PARK_SCOPE.set(scope)
        return asyncio.ensure_future(bundle.coord.claim(Claim(worker_id="w1", wait_s=60.0)))
    res = await result(contextvars.copy_context().run(in_scope))
    assert res.job is None and res.reasons == [UNDELIVERED]
    view = await bundle.coord.get_job(JobId(job_id=job))
    assert view.status == "waiting" and view.lease is None and view.attempts == 0
    assert UNDELIVERED in [e.reason for e in view.events][-1]
    again = await bundle.claim("w1")  # and a live worker gets it
    assert again.job.job_id == job


async def test_a_parked_claim_wakes_for_its_new_role_noted_while_nothing_was_parked(bundle):
    """Roles a worker heartbeats while no claim is parked are not noted by coordd.service.push;
    a claim parked after them must still wake for a job of its new role."""
    await bundle.worker("w2", roles=["gpu"])
    t = parked_claim(bundle, "w2")
    await asleep(bundle, 1)
    await bundle.worker("w1", roles=["gpu"])  # noted: a claim is parked
    bundle.clock.advance(61)
    assert (await result(t)).job is None
    await bundle.worker("w1", roles=["cpu"])  # nothing parked: not noted
    t = parked_claim(bundle, "w1")
    await asleep(bundle, 1)
    job = await bundle.enqueue(role="cpu")
    assert (await result(t)).job.job_id == job


async def test_watch_events_refuses_a_cursor_past_any_event_id(bundle):
    for bad in (1 << 63, (1 << 64) - 1):
        with pytest.raises(errors.BadRequest, match="after must be"):
            await bundle.coord.watch_events(WatchEvents(after=bad))


async def test_a_feed_cursor_past_the_head_is_answered_with_the_head(bundle):
    """A cursor from another database (a restore, a new file under a running reader) is
    past the head: answered at once with next_after = the head, so the reader goes on
    instead of parking on ids that may never come."""
    await bundle.enqueue()
    head = (await bundle.coord.watch_events(WatchEvents(after=0))).next_after
    assert head > 0
    res = await asyncio.wait_for(bundle.coord.watch_events(
        WatchEvents(after=head + 1000, wait_s=60)), 5)
    assert res.events == [] and res.next_after == head
    job = await bundle.enqueue()
    nxt = await bundle.coord.watch_events(WatchEvents(after=res.next_after))
    assert [e.job_id for e in nxt.events] == [job]


async def test_a_feed_cursor_survives_a_prune_of_the_newest_events(make_bundle):
    """Event ids are rowids: a prune that deleted the newest events would hand their ids
    out again, and a reader resuming from its cursor would miss the new events."""
    b = await make_bundle(retention_s=1.0)
    job = await b.enqueue()
    await b.coord.cancel(JobId(job_id=job))
    cursor = (await b.coord.watch_events(WatchEvents(after=0))).next_after
    b.clock.advance(10)
    await b.coord.prune(Empty())
    fresh = await b.enqueue()
    got = await b.coord.watch_events(WatchEvents(after=cursor))
    assert [e.job_id for e in got.events] == [fresh]


async def test_a_backoff_due_after_a_clock_step_back_wakes_the_parked_claim(bundle):
    """The writer moves a backoff's run_at by a wall-clock step; the run_at timer must
    take the moved time, not wait out the step (600 s) with the parked claim asleep."""
    await bundle.worker("w1")
    job = await bundle.enqueue()
    c = await bundle.claim("w1", lease_s=30.0)
    r = await bundle.coord.fail(Fail(job_id=job, worker_id="w1", token=c.lease.token,
                                     error="flaky", retryable=True))
    delay = r.run_at - bundle.clock.wall()
    t = parked_claim(bundle, "w1", wait_s=3000.0)
    await asleep(bundle, 1)
    bundle.clock.jump_wall(-600.0)
    await bundle.coord.heartbeat(Heartbeat(worker_id="w2", roles=["gpu"], readings=COOL))
    await asleep(bundle, 1)  # the writer took the step (another worker's heartbeat)
    bundle.clock.advance(delay + 1)
    assert (await result(t)).job.job_id == job


async def test_a_run_at_due_sooner_after_a_clock_step_ahead_wakes_the_parked_claim(make_bundle):
    """A client's run_at is calendar time: after a +45 s step it is due 45 s sooner in
    real time, and the parked claim must wake then, not when the old wait runs out."""
    bundle = await make_bundle(heartbeat_stale_s=300)  # w1's heartbeat stays fresh
    await bundle.worker("w1")
    job = await bundle.enqueue(run_at=bundle.clock.wall() + 100)
    t = parked_claim(bundle, "w1", wait_s=3000.0)
    await asleep(bundle, 1)
    bundle.clock.jump_wall(45.0)
    await bundle.coord.heartbeat(Heartbeat(worker_id="w2", roles=["gpu"], readings=COOL))
    await asleep(bundle, 1)
    bundle.clock.advance(56)
    assert (await result(t)).job.job_id == job


async def test_a_workers_new_watch_supersedes_its_parked_one(bundle):
    """A worker re-parks its watch when a job it was told about starts again (worker.control
    `started`): the older call, given up by the worker, must not hold a parked-call slot
    until its wait runs out (16 such on one connection refused every call after them)."""
    await bundle.worker("w1")
    job = await bundle.enqueue()
    await bundle.claim("w1")
    old = asyncio.ensure_future(bundle.coord.watch_worker(WatchWorker(
        worker_id="w1", wait_s=60, seen=WorkerActions(cancel=[job]))))
    other = asyncio.ensure_future(bundle.coord.watch_worker(WatchWorker(worker_id="w2",
                                                                        wait_s=60)))
    await asleep(bundle, 2)
    new = asyncio.ensure_future(bundle.coord.watch_worker(WatchWorker(worker_id="w1",
                                                                      wait_s=60)))
    assert (await result(old)).cancel == []  # at once, with nothing (no time passed)
    await asleep(bundle, 2)
    assert not new.done() and not other.done() and bundle.coord.push.parked == 2
    await bundle.coord.cancel(JobId(job_id=job))
    assert (await result(new)).cancel == [job]
    other.cancel()
