"""Parked calls (issue 15) on a pinned clock: what answers a parked claim (enqueue, run_at
coming due, reap, a workflow node unblocking, a gate opening), arrival and priority order,
the race between a claim's look and a commit, caps, wait_job, watch_worker, watch_events.
No sleeps make time pass: FakeClock does; `settle()` only lets the loop run."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from coordd import errors
from coordd.wire.protocol import Claim, Complete, Empty, Enqueue, JobId
from coordd.wire.push import (
    EventFilter, WaitJob, WatchEvents, WatchWorker, WorkerActions,
)
from coordd.wire.workflows import WorkflowSubmit
from coordd.service.push import PARK_SCOPE, ParkScope
from tests.conftest import T0


async def settle(rounds: int = 20) -> None:
    """Let the loop run the writer's batches and the woken waiters (no time passes)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def asleep(bundle, n: int) -> None:
    """Until `n` parked calls are asleep (their look, maybe a read on the reader's thread,
    is done); a bounded wait on the loop, no time passes on the clock."""
    for _ in range(2000):
        await settle(2)
        if bundle.coord.push.sleeping == n:
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"{bundle.coord.push.sleeping} asleep, expected {n}")


async def result(t):
    return await asyncio.wait_for(t, 5)


def parked_claim(bundle, worker_id: str, wait_s: float = 60.0, **kw):
    return asyncio.ensure_future(bundle.coord.claim(
        Claim(worker_id=worker_id, lease_s=30.0, wait_s=wait_s, **kw)))


async def test_parked_claim_is_answered_by_an_enqueue(bundle):
    await bundle.worker("w1")
    t = parked_claim(bundle, "w1")
    await settle()
    assert not t.done() and bundle.coord.push.parked == 1
    job = await bundle.enqueue(priority=1)
    await settle()
    res = t.result()
    assert res.job.job_id == job and res.lease is not None
    assert bundle.coord.push.parked == 0


async def test_parked_claim_times_out_with_no_job(bundle):
    await bundle.worker("w1")
    t = parked_claim(bundle, "w1", wait_s=5.0)
    await settle()
    bundle.clock.advance(4.9)
    await settle()
    assert not t.done()
    bundle.clock.advance(0.2)
    await settle()
    assert t.result().job is None and bundle.coord.push.parked == 0


async def test_a_commit_between_the_claims_look_and_its_park_is_not_lost(bundle):
    """The claim's transaction and an enqueue land in one batch, the claim first: it saw
    nothing, yet the enqueue's commit wakes it before it could sleep past the job."""
    await bundle.worker("w1")
    t = parked_claim(bundle, "w1")
    e = asyncio.ensure_future(bundle.enqueue())
    await settle()
    assert t.done() and t.result().job.job_id == e.result()


async def test_parked_claim_answered_when_run_at_comes_due(bundle):
    await bundle.worker("w1")
    job = await bundle.enqueue(run_at=T0 + 10)
    t = parked_claim(bundle, "w1")
    await settle()
    bundle.clock.advance(9)
    await bundle.worker("w1")  # fresh heartbeat: only the time decides
    await settle()
    assert not t.done()
    bundle.clock.advance(1.01)
    await settle()
    assert t.result().job.job_id == job


async def test_run_at_timer_is_kept_across_a_restart(make_bundle, tmp_path):
    first = await make_bundle()
    job = await first.enqueue(run_at=T0 + 20)
    await first.coord.close()
    from coordd import config as config_mod
    from coordd.daemon.server import sqlite_coordinator
    coord = sqlite_coordinator(first.db_path, config_mod.load(None), first.clock)
    await coord.start()
    try:
        from coordd.wire.protocol import Heartbeat
        await coord.heartbeat(Heartbeat(worker_id="w1", roles=["cpu"],
                                        readings={"memory_used_pct": 10.0}))
        t = asyncio.ensure_future(coord.claim(Claim(worker_id="w1", wait_s=60.0)))
        await settle()
        first.clock.advance(20.01)
        await settle()
        assert t.result().job.job_id == job
    finally:
        await coord.close()


async def test_parked_claim_answered_by_a_reap(bundle):
    await bundle.worker("w1")
    await bundle.worker("w2")
    job = await bundle.enqueue()
    assert (await bundle.claim("w1", lease_s=30.0)).job.job_id == job
    t = parked_claim(bundle, "w2", wait_s=120.0)
    await settle()
    bundle.clock.advance(31)
    await bundle.worker("w2")
    await settle()
    assert not t.done()  # expired, not yet reaped: nothing is claimable
    assert (await bundle.coord.reap(Empty())).reaped == 1
    await settle()
    assert t.result().job.job_id == job


async def test_parked_claim_answered_by_a_workflow_node_unblocking(bundle):
    await bundle.worker("a", roles=["first"])
    await bundle.worker("b", roles=["second"])
    await bundle.coord.workflow_submit(msgspec.convert({"name": "two", "nodes": [
        {"name": "one", "kind": "k", "required_role": "first", "payload": {}},
        {"name": "two", "kind": "k", "required_role": "second", "payload": {},
         "needs": ["one"]}]}, WorkflowSubmit))
    t = parked_claim(bundle, "b")
    got = await bundle.claim("a")
    await settle()
    assert not t.done()
    await bundle.coord.complete(Complete(job_id=got.job.job_id, worker_id="a",
                                         token=got.lease.token, result={"ok": 1}))
    await settle()
    res = t.result()
    assert res.job is not None and res.job.required_role == "second"


async def test_parked_claim_answered_by_a_gate_opening(bundle):
    await bundle.worker("w1", memory_used_pct=97.0)
    job = await bundle.enqueue(priority=1)
    t = parked_claim(bundle, "w1")
    await settle()
    assert not t.done()
    await bundle.worker("w1", memory_used_pct=40.0)
    await settle()
    assert t.result().job.job_id == job


async def test_one_job_wakes_the_first_parked_claim_the_next_stays_parked(bundle):
    for w in ("w1", "w2", "w3"):
        await bundle.worker(w)
    tasks = []
    for w in ("w1", "w2", "w3"):
        tasks.append(parked_claim(bundle, w))
        await settle()
    job = await bundle.enqueue()
    await settle()
    assert tasks[0].result().job.job_id == job
    assert not tasks[1].done() and not tasks[2].done()
    job2 = await bundle.enqueue()
    await settle()
    assert tasks[1].result().job.job_id == job2 and not tasks[2].done()
    tasks[2].cancel()


async def test_priority_order_holds_across_parked_workers(bundle):
    """Two parked workers, then a P3 and a P0 job in one commit: the first parked claim
    takes the P0 job, the second the P3 one."""
    await bundle.worker("w1")
    await bundle.worker("w2")
    t1 = parked_claim(bundle, "w1")
    await settle()
    t2 = parked_claim(bundle, "w2")
    await settle()
    jobs = (await bundle.coord.enqueue_batch(msgspec.convert({"jobs": [
        {"kind": "k", "required_role": "cpu", "priority": 3, "payload": {}},
        {"kind": "k", "required_role": "cpu", "priority": 0, "payload": {}}]},
        type=__import__("coordd.wire.protocol", fromlist=["EnqueueBatch"]).EnqueueBatch))).jobs
    await settle()
    assert t1.result().job.job_id == jobs[1].job_id and t1.result().job.priority == 0
    assert t2.result().job.job_id == jobs[0].job_id


async def test_credit_passes_on_when_the_woken_claim_is_refused_by_its_gates(bundle):
    """The first parked worker is too hot for the job; the credit goes to the next one."""
    await bundle.worker("hot", temperature_c=99.0)
    await bundle.worker("cool")
    t_hot = parked_claim(bundle, "hot")
    await settle()
    t_cool = parked_claim(bundle, "cool")
    await settle()
    job = await bundle.enqueue(priority=1)
    await settle()
    assert t_cool.result().job.job_id == job and not t_hot.done()
    t_hot.cancel()


async def test_a_woken_claim_that_loses_the_race_parks_again(bundle):
    await bundle.worker("parked")
    await bundle.worker("fast")
    t = parked_claim(bundle, "parked")
    await settle()
    e = asyncio.ensure_future(bundle.enqueue())
    c = asyncio.ensure_future(bundle.claim("fast"))  # same batch, right after the enqueue
    await settle()
    assert c.result().job.job_id == e.result()
    assert not t.done() and bundle.coord.push.parked == 1
    job2 = await bundle.enqueue()
    await settle()
    assert t.result().job.job_id == job2


async def test_kinds_and_roles_choose_whom_to_wake(bundle):
    await bundle.worker("gpu", roles=["gpu"])
    await bundle.worker("cpu", roles=["cpu"])
    t_gpu = parked_claim(bundle, "gpu")
    await settle()
    t_cpu = parked_claim(bundle, "cpu", kinds=["embed"])
    await settle()
    await bundle.enqueue(role="cpu", kind="train")  # nobody parked runs train on cpu
    await settle()
    assert not t_gpu.done() and not t_cpu.done()
    job = await bundle.enqueue(role="cpu", kind="embed")
    await settle()
    assert t_cpu.result().job.job_id == job and not t_gpu.done()
    t_gpu.cancel()


async def test_a_workers_new_claim_supersedes_its_parked_one(bundle):
    """Issue 31 item 2: a worker whose slot freed claims again at once for more kinds; its
    older parked claim ends with nothing (no look, no lease nobody reads), and a job of a
    kind only the new one names goes to the new one."""
    await bundle.worker("w1")
    await bundle.worker("w2")
    narrow = parked_claim(bundle, "w1", kinds=["x"])
    other = parked_claim(bundle, "w2", kinds=["x"])
    await asleep(bundle, 2)
    wide = parked_claim(bundle, "w1", kinds=["x", "m"])
    await settle()
    got = await result(narrow)
    assert got.job is None and got.reasons == []
    assert not wide.done() and not other.done()  # another worker's claim is its own
    job = await bundle.enqueue(kind="m")
    await settle()
    assert (await result(wide)).job.job_id == job
    other.cancel()


async def test_claim_id_replay_while_parked_returns_the_granted_lease(bundle):
    await bundle.worker("w1")
    t = parked_claim(bundle, "w1", claim_id="c-1")
    await settle()
    job = await bundle.enqueue()
    await settle()
    first = t.result()
    again = await bundle.coord.claim(Claim(worker_id="w1", claim_id="c-1", wait_s=30.0))
    assert again.job.job_id == job and again.lease.token == first.lease.token


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


async def test_enqueue_rolled_back_wakes_nobody_for_good(bundle):
    """A refused enqueue (its trigger fired, its savepoint rolled back) may wake a claim,
    which looks, finds nothing and parks again: never a wrong answer."""
    await bundle.worker("w1")
    t = parked_claim(bundle, "w1")
    await settle()
    with pytest.raises(errors.BadRequest):
        await bundle.coord.enqueue(Enqueue(kind="k", required_role="cpu", priority=9,
                                           payload={}))
    await settle()
    assert not t.done()
    t.cancel()


async def test_nothing_parked_a_drain_makes_no_wake_up_call(bundle):
    """While nothing is parked the claim/complete path notes nothing to wake; a job
    scheduled ahead is still noted (the run_at timer needs it)."""
    calls: list[str] = []
    push = bundle.coord.push
    real = push._dispatch
    def dispatch(notes):
        calls.extend(n[0] for n in notes)
        real(notes)
    push._dispatch = dispatch
    await bundle.worker("w1")
    for _ in range(3):
        await bundle.enqueue()
    for _ in range(3):
        got = await bundle.claim("w1")
        await bundle.coord.complete(Complete(job_id=got.job.job_id, worker_id="w1",
                                             token=got.lease.token, result={}))
    assert calls == []
    await bundle.enqueue(run_at=T0 + 60)
    assert calls == ["w"]
    t = parked_claim(bundle, "w1")
    await settle()
    await bundle.enqueue()
    assert calls == ["w", "w"]
    await settle()
    assert t.result().job is not None


async def test_waited_s_says_how_long_the_claim_was_parked(bundle):
    """The worker times its lease from its send plus waited_s, so a claim answered after
    7 s parked does not look 7 s shorter than it is."""
    await bundle.worker("w1")
    t = parked_claim(bundle, "w1", wait_s=30.0)
    await asleep(bundle, 1)
    bundle.clock.advance(7.0)
    await bundle.worker("w1")
    await bundle.enqueue()
    res = await result(t)
    assert res.job is not None and res.waited_s == pytest.approx(7.0)
    assert res.lease.expires_at == pytest.approx(bundle.clock.wall() + 30.0)
    direct = await bundle.claim("w1")
    assert direct.waited_s == 0.0
    t = parked_claim(bundle, "w1", wait_s=5.0)  # and one that times out says its wait
    await asleep(bundle, 1)
    bundle.clock.advance(5.1)
    empty = await result(t)
    assert empty.job is None and empty.waited_s == pytest.approx(5.1)
