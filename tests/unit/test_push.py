"""Parked claims (issue 15) on a pinned clock: what answers a parked claim (enqueue, run_at
coming due, reap, a workflow node unblocking, a gate opening), arrival and priority order,
the race between a claim's look and a commit, a claim superseded or replayed, how long it
waited. wait_job, watch_worker, watch_events and the bounds of every parked call are in
tests/unit/test_waits.py. No sleeps make time pass: FakeClock does; `settle()` only lets
the loop run."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from coordd import errors
from coordd.wire.protocol import Claim, Complete, Empty, Enqueue
from coordd.wire.workflows import WorkflowSubmit
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
