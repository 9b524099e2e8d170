"""The other parked calls (issue 15) on a pinned clock: wait_job, watch_worker and
watch_events, and what bounds every parked call, claims included: the caps per connection
and in all, wait_s checks, park_wait_max_s, and closing, which answers each at once.
No sleeps make time pass: FakeClock does. Parked claims are tests/unit/test_push.py."""

from __future__ import annotations

import asyncio

import pytest

from coordd import errors
from coordd.service.push import PARK_SCOPE, ParkScope
from coordd.wire.protocol import Claim, Complete, JobId
from coordd.wire.push import EventFilter, WaitJob, WatchEvents, WatchWorker, WorkerActions
from tests.unit.test_push import asleep, parked_claim, result, settle


async def test_caps_on_parked_calls(make_bundle):
    b = await make_bundle(park_max_per_connection=2, park_max_total=3)
    for w in ("w1", "w2", "w3", "w4"):  # one claim each: a worker's new claim supersedes
        await b.worker(w)
    scope_a, scope_b = ParkScope(), ParkScope()

    def in_scope(scope: ParkScope, coro):
        PARK_SCOPE.set(scope)
        return asyncio.ensure_future(coro)

    import contextvars
    ts = [contextvars.copy_context().run(in_scope, scope_a, b.coord.claim(
        Claim(worker_id=w, wait_s=60.0))) for w in ("w1", "w2")]
    await settle()
    with pytest.raises(errors.Overloaded, match="this connection"):
        await contextvars.copy_context().run(in_scope, scope_a, b.coord.wait_job(
            WaitJob(job_id="nope", timeout_s=5)))
    ts.append(contextvars.copy_context().run(in_scope, scope_b, b.coord.claim(
        Claim(worker_id="w3", wait_s=60.0))))
    await settle()
    with pytest.raises(errors.Overloaded, match="in all"):
        await contextvars.copy_context().run(in_scope, scope_b, b.coord.claim(
            Claim(worker_id="w4", wait_s=60.0)))
    scope_a.close()  # connection A went away: its parked calls end, without a job
    await settle()
    assert ts[0].result().job is None and ts[1].result().job is None
    assert b.coord.push.parked == 1
    job = await b.enqueue()
    await settle()
    assert ts[2].result().job.job_id == job  # the dropped ones did not take it


async def test_closing_answers_every_parked_call_at_once(bundle):
    await bundle.worker("w1")
    job = await bundle.enqueue(kind="other", role="none")
    calls = [parked_claim(bundle, "w1"),
             asyncio.ensure_future(bundle.coord.wait_job(WaitJob(job_id=job, timeout_s=60))),
             asyncio.ensure_future(bundle.coord.watch_events(WatchEvents(
                 after=0, wait_s=60, filter=EventFilter(job_id="no-such-job")))),
             asyncio.ensure_future(bundle.coord.watch_worker(WatchWorker(worker_id="w1",
                                                                         wait_s=60)))]
    await asleep(bundle, 4)
    await bundle.coord.push.close()
    assert (await result(calls[0])).job is None
    assert (await result(calls[1])).terminal is False
    assert (await result(calls[2])).events == []
    assert (await result(calls[3])).cancel == []
    with pytest.raises(errors.Overloaded):
        await bundle.coord.claim(Claim(worker_id="w1", wait_s=5))


async def test_wait_job_on_a_terminal_job_returns_at_once(bundle):
    job = await bundle.enqueue()
    await bundle.coord.cancel(JobId(job_id=job))
    res = await asyncio.wait_for(bundle.coord.wait_job(WaitJob(job_id=job, timeout_s=60)), 1)
    assert res.terminal and res.job.status == "cancelled"
    assert bundle.coord.push.parked == 0


async def test_wait_job_answers_when_the_job_ends_and_at_its_timeout(bundle):
    await bundle.worker("w1")
    job = await bundle.enqueue()
    got = await bundle.claim("w1")
    t = asyncio.ensure_future(bundle.coord.wait_job(WaitJob(job_id=job, timeout_s=60)))
    await asleep(bundle, 1)
    await bundle.coord.renew(__import__("coordd.wire.protocol", fromlist=["Renew"]).Renew(
        job_id=job, worker_id="w1", token=got.lease.token))
    await asleep(bundle, 1)  # a commit about the job that does not end it
    assert not t.done()
    await bundle.coord.complete(Complete(job_id=job, worker_id="w1", token=got.lease.token,
                                         result={"n": 1}))
    done = await result(t)
    assert done.terminal and done.job.result == {"n": 1}
    other = await bundle.enqueue()
    t2 = asyncio.ensure_future(bundle.coord.wait_job(WaitJob(job_id=other, timeout_s=3)))
    await asleep(bundle, 1)
    bundle.clock.advance(3.1)
    late = await result(t2)
    assert late.terminal is False and late.job.status == "waiting"
    with pytest.raises(errors.NotFound):
        await bundle.coord.wait_job(WaitJob(job_id="missing", timeout_s=3))


async def test_watch_worker_pushes_a_cancel_to_the_holder(bundle):
    await bundle.worker("w1")
    job = await bundle.enqueue()
    await bundle.claim("w1")
    t = asyncio.ensure_future(bundle.coord.watch_worker(WatchWorker(worker_id="w1",
                                                                    wait_s=60)))
    await asleep(bundle, 1)
    await bundle.coord.cancel(JobId(job_id=job))
    acts = await result(t)
    assert acts.cancel == [job] and acts.suspend == acts.resume == acts.vacate == []
    # told once: with the job in `seen`, the watch parks again
    t2 = asyncio.ensure_future(bundle.coord.watch_worker(WatchWorker(
        worker_id="w1", wait_s=5, seen=WorkerActions(cancel=[job]))))
    await asleep(bundle, 1)
    bundle.clock.advance(5.1)
    assert (await result(t2)).cancel == [job]


async def test_watch_events_follows_the_log_from_a_cursor(bundle):
    first = await bundle.coord.watch_events(WatchEvents(after=0))
    assert first.events == [] and first.next_after == 0
    t = asyncio.ensure_future(bundle.coord.watch_events(WatchEvents(after=0, wait_s=60)))
    await asleep(bundle, 1)
    await bundle.worker("w1")  # a commit with no job event does not answer it
    await asleep(bundle, 1)
    assert not t.done()
    job = await bundle.enqueue()
    res = await result(t)
    assert [(e.job_id, e.to_status) for e in res.events] == [(job, "waiting")]
    await bundle.claim("w1")
    nxt = await bundle.coord.watch_events(WatchEvents(after=res.next_after))
    assert [e.to_status for e in nxt.events] == ["running"]
    assert nxt.events[0].kind == "k"
    only = await bundle.coord.watch_events(WatchEvents(
        after=0, filter=EventFilter(to_status=["running"])))
    assert [e.to_status for e in only.events] == ["running"]
    assert only.next_after == nxt.next_after
    for bad in (WatchEvents(after=-1), WatchEvents(limit=0), WatchEvents(wait_s=float("nan"))):
        with pytest.raises(errors.BadRequest):
            await bundle.coord.watch_events(bad)


async def test_bad_wait_s_is_refused(bundle):
    await bundle.worker("w1")
    for bad in (float("nan"), -1.0):
        with pytest.raises(errors.BadRequest, match="wait_s"):
            await bundle.coord.claim(Claim(worker_id="w1", wait_s=bad))
    with pytest.raises(errors.BadRequest):
        await bundle.coord.wait_job(WaitJob(job_id="x", timeout_s=float("nan")))
    assert bundle.coord.push.parked == 0


async def test_wait_is_cut_to_park_wait_max_s(make_bundle):
    b = await make_bundle(park_wait_max_s=2.0)
    await b.worker("w1")
    t = asyncio.ensure_future(b.coord.claim(Claim(worker_id="w1", wait_s=3600.0)))
    await settle()
    b.clock.advance(2.1)
    await settle()
    assert t.result().job is None
