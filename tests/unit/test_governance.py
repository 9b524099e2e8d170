"""Governance of running jobs (issue 16, item 1): coordd decides on each heartbeat and
renew whether a held job continues, is suspended, resumed or vacated. Pinned clock."""

from __future__ import annotations

import asyncio

import pytest

from coordd import errors
from coordd.rules.gates import GatePolicy
from coordd.rules.governance import GovState, decide
from coordd.wire.protocol import Heartbeat, JobId, Renew
from coordd.wire.push import WatchWorker, WorkerActions
from coordd.wire.workers import Release
from tests.conftest import COOL
from tests.unit.test_push import asleep

ACTIVE = {**COOL, "user_idle_s": 2.0}


async def beat(bundle, worker_id="w1", **readings):
    return await bundle.coord.heartbeat(Heartbeat(
        worker_id=worker_id, roles=["cpu"], readings={**COOL, **readings}))


def action_of(reply, job_id):
    return {a.job_id: (a.action, a.reason) for a in reply.actions}[job_id]


async def running_p3(bundle, **enqueue):
    await beat(bundle)
    job = await bundle.enqueue(priority=3, **enqueue)
    claimed = await bundle.claim("w1", lease_s=300)
    assert claimed.job.job_id == job
    return job, claimed.lease.token


async def test_p3_is_suspended_when_the_user_returns_and_keeps_its_lease(bundle):
    job, token = await running_p3(bundle)
    assert action_of(await beat(bundle), job)[0] == "continue"
    bundle.clock.advance(5)
    act, why = action_of(await beat(bundle, user_idle_s=2.0), job)
    assert act == "suspend" and why.startswith("user_active")
    bundle.clock.advance(5)  # said again on every reply while it stays suspended
    assert action_of(await beat(bundle, user_idle_s=7.0), job)[0] == "suspend"
    renewed = await bundle.coord.renew(Renew(job_id=job, worker_id="w1", token=token,
                                             lease_s=300))
    assert renewed.action.action == "suspend"  # the renew says the same: one function decides
    view = await bundle.coord.get_job(JobId(job_id=job))
    assert view.status == "running" and view.lease.governance.suspended_at == 105.0
    assert view.lease.governance.suspend_reason == "user_active"
    assert [e.reason.split(":")[0] for e in view.events].count("suspended") == 1
    (w,) = (await bundle.coord.workers()).workers  # `coordctl workers` says the same
    assert f"governance: {job} suspended since " in " ".join(w.notes)
    assert w.notes[-1].endswith("(user_active)")


async def test_resume_needs_the_gates_open_for_resume_after_s_no_flapping(bundle):
    job, _ = await running_p3(bundle)
    await beat(bundle, user_idle_s=1.0)  # suspended at t=100
    seen = []
    # the gate opens and closes every 20 s: never open for 60 s, so never resumed
    for i in range(6):
        bundle.clock.advance(20)
        idle = 4000.0 if i % 2 == 0 else 1.0
        seen.append(action_of(await beat(bundle, user_idle_s=idle), job)[0])
    assert seen == ["suspend"] * 6
    for _ in range(3):  # open for 0, 30, 60 s
        seen.append(action_of(await beat(bundle), job)[0])
        bundle.clock.advance(30)
    assert seen[-3:] == ["suspend", "suspend", "resume"]
    assert action_of(await beat(bundle), job)[0] == "continue"
    view = await bundle.coord.get_job(JobId(job_id=job))
    assert view.lease.governance is None
    assert [e.reason.split(":")[0] for e in view.events][-2:] == ["suspended", "resumed"]


async def test_temperature_resumes_only_below_the_limit_minus_hysteresis(bundle):
    job, _ = await running_p3(bundle)  # P3 max_temperature_c 80, hysteresis 5
    assert action_of(await beat(bundle, temperature_c=82.0), job)[0] == "suspend"
    bundle.clock.advance(100)
    assert action_of(await beat(bundle, temperature_c=78.0), job)[0] == "suspend"
    bundle.clock.advance(100)  # 78 is under 80 but not under 75: still held
    assert action_of(await beat(bundle, temperature_c=78.0), job)[0] == "suspend"
    await beat(bundle, temperature_c=74.0)
    bundle.clock.advance(60)
    act, why = action_of(await beat(bundle, temperature_c=74.0), job)
    assert act == "resume" and "too_hot" in why


async def test_suspended_longer_than_max_suspend_s_is_vacated(make_bundle):
    bundle = await make_bundle(gates={"p3": {"max_suspend_s": 120}})
    job, token = await running_p3(bundle)
    await beat(bundle, user_idle_s=1.0)
    bundle.clock.advance(119)
    assert action_of(await beat(bundle, user_idle_s=1.0), job)[0] == "suspend"
    bundle.clock.advance(1)
    act, why = action_of(await beat(bundle, user_idle_s=1.0), job)
    assert act == "vacate" and why.startswith("max_suspend_s") and "user_active" in why
    bundle.clock.advance(1)  # a vacate once decided stands, even when the user leaves
    assert action_of(await beat(bundle), job)[0] == "vacate"
    res = await bundle.coord.release(Release(job_id=job, worker_id="w1", token=token,
                                             reason="vacated: " + why,
                                             checkpoint={"step": 7}))
    assert res.status == "waiting"
    view = await bundle.coord.get_job(JobId(job_id=job))
    assert view.attempts == 0 and view.preemptions == 1 and view.checkpoint == {"step": 7}
    again = await bundle.claim("w1", lease_s=300)  # the next lease starts unsuspended
    assert again.job.attempts == 1 and again.job.checkpoint == {"step": 7}
    assert action_of(await beat(bundle), job)[0] == "continue"


async def test_release_of_a_vacated_job_is_fenced(make_bundle):
    bundle = await make_bundle(gates={"p3": {"on_close": "vacate"}})
    job, token = await running_p3(bundle)
    assert action_of(await beat(bundle, on_battery=True), job)[0] == "vacate"
    with pytest.raises(errors.LeaseLost):
        await bundle.coord.release(Release(job_id=job, worker_id="w1", token=token + 1,
                                           reason="vacated"))
    with pytest.raises(errors.LeaseLost):
        await bundle.coord.release(Release(job_id=job, worker_id="w2", token=token,
                                           reason="vacated"))
    bundle.clock.advance(301)
    with pytest.raises(errors.LeaseExpired):
        await bundle.coord.release(Release(job_id=job, worker_id="w1", token=token,
                                           reason="vacated"))


async def test_p0_to_p2_run_on_unless_critically_hot(bundle):
    await beat(bundle)
    job = await bundle.enqueue(priority=1)
    await bundle.claim("w1", lease_s=300)
    reply = await beat(bundle, temperature_c=93.0, user_idle_s=0.0, on_battery=True)
    assert action_of(reply, job)[0] == "continue"  # above its claim gate (90), below 95
    act, why = action_of(await beat(bundle, temperature_c=96.0), job)
    assert act == "suspend" and why.startswith("critical_temperature")
    bundle.clock.advance(60)
    assert action_of(await beat(bundle, temperature_c=92.0), job)[0] == "suspend"
    await beat(bundle, temperature_c=89.0)
    bundle.clock.advance(60)
    assert action_of(await beat(bundle, temperature_c=89.0), job)[0] == "resume"


async def test_governance_counts_and_other_workers_jobs_untouched(bundle):
    job, _ = await running_p3(bundle)
    await beat(bundle, "w2")
    other = await bundle.enqueue(priority=3)
    await bundle.claim("w2", lease_s=300)
    reply = await beat(bundle, user_idle_s=0.0)
    assert [a.job_id for a in reply.actions] == [job]
    assert action_of(await beat(bundle, "w2"), other)[0] == "continue"
    text = (await bundle.coord.metrics()).text
    assert 'coordd_governance_actions_total{action="suspend",reason="user_active"} 1.0' in text


@pytest.mark.parametrize("policy", [
    GatePolicy(on_close="suspend", resume_after_s=0.0, max_suspend_s=0.0),
    GatePolicy(on_close="continue", critical_temperature_c=None),
])
def test_decide_edges(policy):
    hot = {"temperature_c": 200.0, "memory_used_pct": 10.0}
    d = decide(policy, hot, GovState(), 1.0)
    if policy.on_close == "continue":
        assert d.action == "continue" and d.event is None
        return
    assert d.action == "suspend"
    assert decide(policy, hot, d.state, 1.0).action == "vacate"  # max_suspend_s 0


def test_gate_policy_refuses_negative_or_nan_times():
    import msgspec
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"resume_after_s": float("nan")}, GatePolicy)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"max_suspend_s": -1}, GatePolicy)


async def test_the_control_watch_carries_suspend_and_vacate_with_their_reasons(make_bundle):
    """The worker's parked `watch_worker` answers as soon as a heartbeat's governance
    suspends a held job, and again when coordd tells it to vacate (level: a suspended job
    stays listed while it holds)."""
    bundle = await make_bundle(gates={"p3": {"max_suspend_s": 30}})
    job, _token = await running_p3(bundle)
    watch = asyncio.ensure_future(bundle.coord.watch_worker(WatchWorker(worker_id="w1",
                                                                        wait_s=60)))
    await asleep(bundle, 1)
    await beat(bundle, user_idle_s=1.0)  # the user is back: P3 suspended
    acts = await asyncio.wait_for(watch, 5)
    assert acts.suspend == [job] and acts.vacate == [] and acts.cancel == []
    assert acts.reasons[job] == "user_active"
    seen = WorkerActions(suspend=[job])
    watch = asyncio.ensure_future(bundle.coord.watch_worker(WatchWorker(
        worker_id="w1", wait_s=60, seen=seen)))
    await asleep(bundle, 1)
    assert not watch.done()  # told once
    bundle.clock.advance(31)
    await beat(bundle, user_idle_s=1.0)  # suspended past max_suspend_s: vacate
    acts = await asyncio.wait_for(watch, 5)
    assert acts.vacate == [job] and acts.reasons[job]
