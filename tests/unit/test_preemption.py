"""Priority preemption (issue 16, item 2): victim choice, preempt_gap,
preempt_min_runtime_s, reservations held and lapsing. Pinned clock, real SQLite."""

from __future__ import annotations

from coordd.rules.preemption import Held, PreemptPolicy, choose_victim
from coordd.wire.protocol import Heartbeat, JobId
from coordd.wire.workers import Release
from tests.conftest import COOL

ONE_SLOT = {"slots_total": 1, "slots": {"k": 1}}


async def beat(bundle, worker_id="w1", **readings):
    return await bundle.coord.heartbeat(Heartbeat(
        worker_id=worker_id, roles=["cpu"], readings={**COOL, **ONE_SLOT, **readings}))


def action_of(reply, job_id):
    return {a.job_id: (a.action, a.reason) for a in reply.actions}.get(job_id)


async def busy_with_p3(bundle, worker_id="w1"):
    await beat(bundle, worker_id)
    victim = await bundle.enqueue(priority=3)
    c = await bundle.claim(worker_id, lease_s=300)
    assert c.job.job_id == victim
    return victim, c.lease.token


def test_victim_is_lowest_priority_then_least_unsaved_work_then_shortest_runtime():
    pol = PreemptPolicy(gap=2, min_runtime_s=30)
    now = 1000.0
    a = Held("w", "a", "k", 2, granted_at=900.0, checkpoint_at=990.0, vacating=False)
    b = Held("w", "b", "k", 3, granted_at=900.0, checkpoint_at=900.0, vacating=False)
    c = Held("w", "c", "k", 3, granted_at=800.0, checkpoint_at=995.0, vacating=False)
    d = Held("w", "d", "k", 3, granted_at=960.0, checkpoint_at=995.0, vacating=False)
    assert choose_victim([a, b], 0, now, pol) is b  # P3 before P2
    assert choose_victim([b, c], 0, now, pol) is c  # 5 s unsaved work before 100 s
    assert choose_victim([c, d], 0, now, pol) is d  # same unsaved work: shorter runtime
    young = Held("w", "e", "k", 3, granted_at=980.0, checkpoint_at=980.0, vacating=False)
    assert choose_victim([young], 0, now, pol) is None  # ran 20 s < preempt_min_runtime_s
    assert choose_victim([a], 1, now, pol) is None  # P2 is only one level below P1
    gone = msgspec_replace(b, vacating=True)
    assert choose_victim([gone], 0, now, pol) is None  # already vacating


def msgspec_replace(h, **kw):
    import msgspec
    return msgspec.structs.replace(h, **kw)


async def test_p1_preempts_a_p3_run_and_the_freed_slot_is_reserved(make_bundle):
    bundle = await make_bundle(preempt_min_runtime_s=30, reservation_s=60)
    victim, token = await busy_with_p3(bundle)
    bundle.clock.advance(10)
    p1 = await bundle.enqueue(priority=1)
    reply = await beat(bundle)
    assert action_of(reply, victim) == ("continue", None)  # ran 10 s < 30 s: kept
    bundle.clock.advance(20)
    act, why = action_of(await beat(bundle), victim)
    assert act == "vacate" and why.startswith(f"preempted_by {p1}")
    waiting = await bundle.coord.get_job(JobId(job_id=p1))
    assert f"waiting for P3 job {victim} to vacate" in waiting.waiting_reason
    res = await bundle.coord.release(Release(job_id=victim, worker_id="w1", token=token,
                                             reason="vacated: preempted"))
    assert res.status == "waiting"
    p0 = await bundle.enqueue(priority=0)  # better in claim order than the P1 job...
    got = await bundle.claim("w1", lease_s=300)
    assert got.job.job_id == p1  # ...but the freed slot was promised to the P1 job
    v = await bundle.coord.get_job(JobId(job_id=victim))
    assert v.status == "waiting" and v.attempts == 0 and v.preemptions == 1
    assert [e.reason for e in v.events if "preempted_by" in (e.reason or "")]
    await beat(bundle, "w2")
    assert (await bundle.claim("w2")).job.job_id == p0
    text = (await bundle.coord.metrics()).text
    assert "coordd_preemptions_total 1.0" in text


async def test_reservation_lapses_after_reservation_s(make_bundle):
    bundle = await make_bundle(preempt_min_runtime_s=0, reservation_s=5)
    victim, token = await busy_with_p3(bundle)
    p1 = await bundle.enqueue(priority=1)
    await beat(bundle)  # the P3 run is chosen, w1's next slot reserved for the P1 job
    bundle.clock.advance(5)
    await beat(bundle)  # lapsed: dropped (and not made again: the victim is vacating)
    view = await bundle.coord.get_job(JobId(job_id=p1))
    assert "reserved" not in view.waiting_reason
    await bundle.coord.release(Release(job_id=victim, worker_id="w1", token=token,
                                       reason="vacated: preempted"))
    p0 = await bundle.enqueue(priority=0)
    assert (await bundle.claim("w1")).job.job_id == p0  # plain priority order again


async def test_no_preemption_below_the_gap_or_when_a_worker_has_room(make_bundle):
    bundle = await make_bundle(preempt_min_runtime_s=0)
    victim, _ = await busy_with_p3(bundle)
    await bundle.enqueue(priority=2)  # one level above P3: gap 2 not reached
    assert action_of(await beat(bundle), victim)[0] == "continue"
    await bundle.enqueue(priority=0)
    await beat(bundle, "w2", slots_total=1)  # w2 is free: it will claim the P0
    assert action_of(await beat(bundle), victim)[0] == "continue"


async def test_a_worker_that_advertises_no_slots_is_never_preempted(make_bundle):
    bundle = await make_bundle(preempt_min_runtime_s=0)
    await bundle.coord.heartbeat(Heartbeat(worker_id="w1", roles=["cpu"], readings=dict(COOL)))
    victim = await bundle.enqueue(priority=3)
    await bundle.claim("w1", lease_s=300)
    await bundle.enqueue(priority=0)
    reply = await bundle.coord.heartbeat(Heartbeat(worker_id="w1", roles=["cpu"],
                                                   readings=dict(COOL)))
    assert action_of(reply, victim)[0] == "continue"


async def test_preempt_gap_zero_turns_preemption_off(make_bundle):
    bundle = await make_bundle(preempt_gap=0, preempt_min_runtime_s=0)
    victim, _ = await busy_with_p3(bundle)
    await bundle.enqueue(priority=0)
    assert action_of(await beat(bundle), victim)[0] == "continue"


async def test_the_full_scan_runs_at_most_once_per_second(make_bundle):
    bundle = await make_bundle(preempt_min_runtime_s=0)
    v1, _ = await busy_with_p3(bundle, "w1")
    v2, _ = await busy_with_p3(bundle, "w2")
    await bundle.enqueue(priority=0)
    assert action_of(await beat(bundle, "w1"), v1)[0] == "vacate"  # the scan ran
    await bundle.enqueue(priority=0)
    assert action_of(await beat(bundle, "w2"), v2)[0] == "continue"  # same second: paced
    bundle.clock.advance(1)
    assert action_of(await beat(bundle, "w2"), v2)[0] == "vacate"
