"""Governance of running work and workers over both stores (coordd.store.api_governance):
live gates suspend and resume a run, a P0 preempts a P3 on a full worker, goodbye and a
new incarnation end leases at once, `workers` lists workers with their readings, a GPU
job waits for its GPU (`resources`) and is granted it once freed. The same
bodies, the same replies and event texts, on SQLite and PostgreSQL, `now` pinned."""

from __future__ import annotations

import asyncio

import pytest

from coordd import config as config_mod
from coordd import errors
from coordd.service import governor
from coordd.rules.resources import Grant, Request
from coordd.store.api import LeaseRef
from coordd.store.api_governance import Governance, WorkerBeat
from coordd.rules.worker_list import worker_views
from tests.store.conftest import COOL, T0, policy

HOT = {**COOL, "temperature_c": 85.0}  # over P3's 80 C, under the critical 95 C
FULL = {"slots_total": 1}  # one job at a time: a second one needs a preemption


def gov(**overrides) -> Governance:
    cfg = config_mod.load(None, **overrides)
    return Governance(policies=cfg.policies(), preemptor=governor.preemptor(cfg))


async def beat(bundle, g: Governance, worker_id: str, now: float, readings=None,
               incarnation: str | None = None, roles=("cpu",)):
    return await bundle.store.heartbeat_governed(
        worker_id, list(roles), readings or COOL, WorkerBeat(incarnation=incarnation), g,
        now=now)


def ref(got, worker_id: str) -> LeaseRef:
    return LeaseRef(got.job.job_id, worker_id, got.lease.token)


def acts(actions):
    return [(a.job_id, a.action) for a in actions]


async def test_a_hot_reading_suspends_a_p3_run_and_a_cool_one_resumes_it(bundle):
    g = gov()
    job_id = await bundle.enqueue(priority=3)
    await beat(bundle, g, "a", T0)
    got = await bundle.claim("a", now=T0 + 1, lease_s=300.0)
    assert got.job.job_id == job_id
    hb = (await beat(bundle, g, "a", T0 + 2, HOT)).result
    assert acts(hb.actions) == [(job_id, "suspend")]
    assert hb.actions[0].reason.startswith("too_hot (temperature 85")
    shown = (await bundle.store.job_governance(job_id, now=T0 + 2)).suspension
    assert (shown.suspended_at, shown.suspend_reason, shown.vacate_reason) == (
        T0 + 2, "too_hot", None)
    res, changes = await bundle.store.renew_governed(ref(got, "a"), 300.0, g, now=T0 + 3)
    assert res.action.action == "suspend" and changes == []  # said again, not logged again
    cool = await beat(bundle, g, "a", T0 + 10)  # gates open since T0+10: not yet
    assert acts(cool.result.actions) == [(job_id, "suspend")] and cool.changes == []
    res, _ = await bundle.store.renew_governed(ref(got, "a"), 300.0, g, now=T0 + 40)
    assert res.action.action == "suspend"  # 30 s open of the 60 s resume_after_s
    back = await beat(bundle, g, "a", T0 + 70)
    assert acts(back.result.actions) == [(job_id, "resume")]
    assert back.changes == [("resume", "too_hot")]
    again = await beat(bundle, g, "a", T0 + 71)
    assert acts(again.result.actions) == [(job_id, "continue")]
    view = await bundle.store.get_job(job_id, now=T0 + 72)
    assert view.status == "running"
    assert [(e.at, e.reason.split(" (")[0]) for e in view.events[2:]] == [
        (T0 + 2, "suspended: too_hot"), (T0 + 70, "resumed: gates open for 60s >= 60s after 68s suspended")]
    await bundle.store.complete(ref(got, "a"), '"done"', now=T0 + 73)


async def test_a_suspension_follows_its_cause_and_says_when_it_resumes(bundle):
    """Issue 31 item 9: a job suspended for too_hot whose cause becomes on_battery says
    on_battery (an event, not a second suspend), and while its gates are open it says
    when it resumes (`resume_at`, the action, `workers`); gates that close again call the
    resume off. The readings change only through heartbeats."""
    g = gov()
    job_id = await bundle.enqueue(priority=3)
    await beat(bundle, g, "a", T0)
    got = await bundle.claim("a", now=T0 + 1, lease_s=300.0)
    assert (await beat(bundle, g, "a", T0 + 2, HOT)).changes == [("suspend", "too_hot")]
    battery = {**COOL, "on_battery": True}
    moved = await beat(bundle, g, "a", T0 + 5, battery)
    assert acts(moved.result.actions) == [(job_id, "suspend")] and moved.changes == []
    assert moved.result.actions[0].reason.startswith("on_battery")
    shown = (await bundle.store.job_governance(job_id, now=T0 + 5)).suspension
    assert (shown.suspended_at, shown.suspend_reason, shown.resume_at) == (
        T0 + 2, "on_battery", None)
    res, changes = await bundle.store.renew_governed(ref(got, "a"), 300.0, g, now=T0 + 6)
    assert res.action.action == "suspend" and changes == []  # no second event either
    opened = await beat(bundle, g, "a", T0 + 10)
    assert opened.changes == [] and opened.result.actions[0].reason == (
        "on_battery: gates open since 1970-01-01T00:01:50Z, resumes at 1970-01-01T00:02:50Z "
        "if they stay open (resume_after_s 60s)")
    shown = (await bundle.store.job_governance(job_id, now=T0 + 10)).suspension
    assert (shown.suspend_reason, shown.resume_at) == ("on_battery", T0 + 70)
    await beat(bundle, g, "a", T0 + 11)  # said again, not logged again
    book = await bundle.store.worker_book(now=T0 + 12)
    assert book.notes["a"] == [
        f"governance: {job_id} suspended since 1970-01-01T00:01:42Z (on_battery), resumes "
        "at 1970-01-01T00:02:50Z if its gates stay open"]
    again = await beat(bundle, g, "a", T0 + 20, battery)  # closed again: called off
    assert again.changes == [] and (await bundle.store.job_governance(
        job_id, now=T0 + 20)).suspension.resume_at is None
    await beat(bundle, g, "a", T0 + 30)
    assert acts((await beat(bundle, g, "a", T0 + 89)).result.actions) == [(job_id, "suspend")]
    back = await beat(bundle, g, "a", T0 + 90)
    assert back.changes == [("resume", "on_battery")]
    assert (await bundle.store.job_governance(job_id, now=T0 + 90)).suspension is None
    view = await bundle.store.get_job(job_id, now=T0 + 91)
    assert [(e.at, e.reason.split(" (")[0].split(":")[0]) for e in view.events[2:]] == [
        (T0 + 2, "suspended"), (T0 + 5, "suspended"), (T0 + 90, "resumed")]
    assert view.events[3].reason == (
        "suspended: now on_battery (power: battery; mains required), was too_hot")
    await bundle.store.complete(ref(got, "a"), '"done"', now=T0 + 92)


async def test_a_renew_suspends_on_the_last_readings_and_a_lost_lease_gets_no_action(bundle):
    g = gov()
    await bundle.enqueue(priority=3)
    await beat(bundle, g, "a", T0)
    got = await bundle.claim("a", now=T0 + 1, lease_s=30.0)
    await bundle.worker("a", now=T0 + 2, **{"user_idle_s": 1.0})  # a plain heartbeat
    res, changes = await bundle.store.renew_governed(ref(got, "a"), 30.0, g, now=T0 + 3)
    assert res.action.action == "suspend" and changes == [("suspend", "user_active")]
    with pytest.raises(errors.LeaseLost):
        await bundle.store.renew_governed(
            LeaseRef(got.job.job_id, "a", got.lease.token + 1), 30.0, g, now=T0 + 4)
    with pytest.raises(errors.LeaseExpired):
        await bundle.store.renew_governed(ref(got, "a"), 30.0, g, now=T0 + 40)


async def test_a_p0_enqueued_vacates_a_p3_run_on_a_full_worker(bundle):
    g = gov()
    p3 = await bundle.enqueue(priority=3)
    await beat(bundle, g, "a", T0, {**COOL, **FULL})
    got = await bundle.claim("a", now=T0 + 1, lease_s=300.0)
    assert got.job.job_id == p3
    p0 = await bundle.enqueue(now=T0 + 20, priority=0)
    early = await beat(bundle, g, "a", T0 + 21, {**COOL, **FULL})  # ran 20 s < 30 s
    assert early.preempted == [] and acts(early.result.actions) == [(p3, "continue")]
    hb = await beat(bundle, g, "a", T0 + 40, {**COOL, **FULL})
    assert hb.preempted == [(p0, p3, "a")]
    assert acts(hb.result.actions) == [(p3, "vacate")]
    assert hb.result.actions[0].reason == f"preempted_by {p0} (P0)"
    assert (await bundle.store.job_governance(p0, now=T0 + 40)).reservation == (
        "a", p3, 3, T0 + 40 + 60.0)  # reservation_s
    assert (await bundle.store.job_governance(p0, now=T0 + 100)).reservation is None  # lapsed
    shown = await bundle.store.job_governance(p3, now=T0 + 40)
    assert shown.suspension.vacate_reason == f"preempted_by {p0} (P0)" and shown.preemptions == 0
    res, _ = await bundle.store.renew_governed(ref(got, "a"), 300.0, g, now=T0 + 41)
    assert res.action.action == "vacate"  # it stands until the lease ends
    assert (await beat(bundle, g, "a", T0 + 42, {**COOL, **FULL})).preempted == []
    released = await bundle.store.release(ref(got, "a"), "vacated", '{"step": 7}', now=T0 + 43)
    assert released.status == "waiting"
    await bundle.worker("b", now=T0 + 43)
    taken = await bundle.claim("a", now=T0 + 44, lease_s=300.0)
    assert taken.job.job_id == p0
    victim = await bundle.store.get_job(p3, now=T0 + 45)
    assert victim.status == "waiting" and victim.attempts == 0 and victim.checkpoint == {"step": 7}
    shown = await bundle.store.job_governance(p3, now=T0 + 45)
    assert shown.preemptions == 1 and shown.suspension is None and shown.reservation is None
    assert [e.reason for e in victim.events][2:] == [
        f"vacate: preempted_by {p0} (P0)", "released: vacated"]
    waiter = await bundle.store.get_job(p0, now=T0 + 45)
    assert [e.reason for e in waiter.events][1:] == [
        f"reserved on a: waits for P3 job {p3} to vacate", "claimed (token 1)"]
    assert (await bundle.claim("b", now=T0 + 46)).job.job_id == p3


async def test_a_reserved_job_is_taken_only_by_a_claim_naming_its_kind(bundle):
    """The worker's claim names the kinds it has a free slot for: while the victim still
    holds the slot of the reserved job's kind, a claim for another kind neither takes the
    reserved job nor drops its reservation (found on PostgreSQL by
    test_governance_worker's kind_full_slots_free case)."""
    g = gov()
    p3 = await bundle.enqueue(priority=3)
    await beat(bundle, g, "a", T0, {**COOL, **FULL})
    got = await bundle.claim("a", now=T0 + 1, lease_s=300.0)
    p0 = await bundle.enqueue(now=T0 + 20, priority=0)
    assert (await beat(bundle, g, "a", T0 + 40, {**COOL, **FULL})).preempted == [(p0, p3, "a")]
    other = await bundle.claim("a", now=T0 + 41, lease_s=300.0, kinds=["other"])
    assert other.job is None
    assert (await bundle.store.get_job(p0, now=T0 + 41)).status == "waiting"
    assert (await bundle.store.job_governance(p0, now=T0 + 41)).reservation == (
        "a", p3, 3, T0 + 40 + 60.0)
    await bundle.store.release(ref(got, "a"), "vacated", None, now=T0 + 42)
    assert (await bundle.claim("a", now=T0 + 43, lease_s=300.0, kinds=["k"])).job.job_id == p0


async def test_preemption_off_and_no_preemption_where_a_worker_has_room(bundle):
    g = gov()
    await bundle.enqueue(priority=3)
    await beat(bundle, g, "a", T0, {**COOL, "slots_total": 2})
    await bundle.claim("a", now=T0 + 1, lease_s=300.0)
    await bundle.enqueue(now=T0 + 40, priority=0)
    assert (await beat(bundle, g, "a", T0 + 41, {**COOL, "slots_total": 2})).preempted == []
    off = gov(preempt_gap=0)
    assert (await beat(bundle, off, "a", T0 + 42, {**COOL, **FULL})).preempted == []


async def test_goodbye_releases_leases_at_once(bundle):
    """goodbye ends the worker's leases now (no wait for expiry) as `worker_lost`: the
    attempt the claim counted stays counted, no further one is spent; another worker
    claims the job at once."""
    g = gov()
    job_id = await bundle.enqueue(priority=2)
    await beat(bundle, g, "a", T0, incarnation="i1")
    got = await bundle.claim("a", now=T0 + 1, lease_s=300.0)
    with pytest.raises(errors.NotFound):
        await bundle.store.goodbye("nobody", None, now=T0 + 2)
    assert await bundle.store.goodbye("a", "i0", now=T0 + 2) == []  # an older incarnation's
    assert (await bundle.store.get_job(job_id, now=T0 + 2)).status == "running"
    assert await bundle.store.goodbye("a", "i1", now=T0 + 3) == [job_id]
    view = await bundle.store.get_job(job_id, now=T0 + 3)
    assert view.status == "waiting" and view.lease is None and view.attempts == 1
    assert (view.events[-1].reason, view.events[-1].worker_id) == ("worker_lost", "a")
    with pytest.raises(errors.LeaseLost):
        await bundle.store.complete(ref(got, "a"), '"late"', now=T0 + 4)
    await bundle.worker("b", now=T0 + 4)
    assert (await bundle.claim("b", now=T0 + 5)).job.job_id == job_id
    book = await bundle.store.worker_book(now=T0 + 6)
    assert book.states["a"].offline_at == T0 + 3 and book.states["a"].incarnation == "i1"
    st = await bundle.store.status(30.0, now=T0 + 6)
    assert (st.workers, st.workers_live) == (2, 1)  # a said goodbye: not live


async def test_a_new_incarnation_ends_the_predecessors_leases(bundle):
    g = gov()
    job_id = await bundle.enqueue()
    await beat(bundle, g, "a", T0, incarnation="i1")
    await bundle.claim("a", now=T0 + 1, lease_s=300.0)
    same = await beat(bundle, g, "a", T0 + 2, incarnation="i1")
    assert same.result.lost == [] and acts(same.result.actions) == [(job_id, "continue")]
    hb = await beat(bundle, g, "a", T0 + 3, incarnation="i2")
    assert hb.result.lost == [job_id] and hb.result.actions == []
    view = await bundle.store.get_job(job_id, now=T0 + 3)
    assert view.status == "waiting" and view.events[-1].reason == "worker_lost"


async def test_workers_lists_workers_with_their_readings(bundle):
    g = gov()
    await bundle.enqueue(priority=3)
    await beat(bundle, g, "a", T0, incarnation="i1")
    await beat(bundle, g, "b", T0, {**COOL, "memory_used_pct": 95.0}, roles=("gpu", "cpu"))
    got = await bundle.claim("a", now=T0 + 1, lease_s=300.0)
    await beat(bundle, g, "a", T0 + 2, {**COOL, "user_idle_s": 2.0}, incarnation="i1")
    book = await bundle.store.worker_book(now=T0 + 40)
    assert book.now == T0 + 40
    views = {w.worker_id: w for w in worker_views(book.rows, book.now, 30.0, g.policies,
                                                  book.states, book.notes, book.grants,
                                                  book.reserved)}
    a, b = views["a"], views["b"]
    assert (a.live, a.heartbeat_at, a.heartbeat_age_s, a.active_leases) == (False, T0 + 2, 38.0, 1)
    assert a.readings["user_idle_s"] == 2.0 and a.incarnation == "i1" and b.roles == ["cpu", "gpu"]
    assert a.verdicts["p3"] == ["heartbeat_stale", "user_active"] and b.live is False
    assert len(a.notes) == 1 and a.notes[0].startswith(
        f"governance: {got.job.job_id} suspended since ") and "(user_active)" in a.notes[0]
    fresh = await bundle.store.worker_book(now=T0 + 10)
    b = {w.worker_id: w for w in worker_views(fresh.rows, fresh.now, 30.0, g.policies,
                                              fresh.states, fresh.notes, fresh.grants,
                                              fresh.reserved)}["b"]
    assert b.live and b.verdicts["p0"] == ["memory_high"] and b.active_leases == 0


GPU = {"gpu_devices": [{"index": 0, "memory_total_mb": 24000.0, "memory_used_mb": 0.0}],
       "ram_mb": 64000}


async def test_a_job_asking_for_a_gpu_it_cannot_get_waits_with_reason_resources(bundle):
    """One GPU: the first GPU job gets it, the second waits with reason `resources`
    (saying what is short) while a job asking for nothing backfills, and is granted the
    GPU once the first ends."""
    pol = policy()
    pol.resources_seen = True  # as a coordd does once a job asks (coordd.service.intake)
    a = await bundle.enqueue(priority=2, resources=Request(gpus=1))
    b = await bundle.enqueue(priority=2, resources=Request(gpus=1, ram_mb=1000))
    plain = await bundle.enqueue(priority=3)
    await bundle.worker("g", **GPU)
    first = await bundle.store.claim("g", 300.0, pol, now=T0 + 1)
    assert (first.job.job_id, first.job.gpu_ids) == (a, [0])
    shown = await bundle.store.job_governance(a, now=T0 + 1)
    assert shown.request == Request(gpus=1) and shown.grant == Grant(gpu_ids=(0,))
    backfill = await bundle.store.claim("g", 300.0, pol, now=T0 + 2)
    assert (backfill.job.job_id, backfill.job.gpu_ids) == (plain, None)
    none = await bundle.store.claim("g", 300.0, pol, now=T0 + 3)
    assert none.job is None and none.reasons == ["resources"]
    assert none.detail == "gpus: need 1 whole, 0 of 1 free"
    book = await bundle.store.worker_book(now=T0 + 3)
    assert book.grants == {"g": [Grant(gpu_ids=(0,))]}
    await bundle.store.complete(ref(first, "g"), '"ok"', now=T0 + 4)
    granted = await bundle.store.claim("g", 300.0, pol, now=T0 + 5)
    assert (granted.job.job_id, granted.job.gpu_ids) == (b, [0])
    assert (await bundle.store.job_governance(b, now=T0 + 5)).grant == Grant(
        gpu_ids=(0,), ram_mb=1000)
    await bundle.store.complete(ref(granted, "g"), '"ok"', now=T0 + 6)
    assert (await bundle.store.job_governance(b, now=T0 + 6)).grant is None  # ended with it


async def test_forget_worker_refuses_a_live_one_and_ends_leases_with_force(bundle):
    g = gov()
    job_id = await bundle.enqueue()
    await beat(bundle, g, "a", T0)
    await bundle.claim("a", now=T0 + 1, lease_s=300.0)
    with pytest.raises(errors.NotFound):
        await bundle.store.forget_worker("nobody", 30.0, False, now=T0 + 2)
    with pytest.raises(errors.InvalidState, match="worker a is live"):
        await bundle.store.forget_worker("a", 30.0, False, now=T0 + 2)
    with pytest.raises(errors.InvalidState, match="holds 1 lease"):
        await bundle.store.forget_worker("a", 30.0, False, now=T0 + 40)  # stale, holding
    assert await bundle.store.forget_worker("a", 30.0, True, now=T0 + 41) == [job_id]
    assert (await bundle.store.worker_book(now=T0 + 42)).rows == []
    view = await bundle.store.get_job(job_id, now=T0 + 42)
    assert view.status == "waiting" and view.events[-1].reason == "worker_lost"


async def test_concurrent_heartbeats_preempt_one_victim_per_waiting_job(bundle):
    """Two full workers heartbeat at once, each with its own pacer (so both scan): the one
    P0 gets one reservation and one victim, whichever scan wins (the later one finds the
    reservation; on PostgreSQL a scan overlapping another skips on its advisory lock, and
    a reservation is inserted ON CONFLICT DO NOTHING)."""
    p3s = [await bundle.enqueue(priority=3) for _ in range(2)]
    pacers = [gov(), gov()]
    for w in ("a", "b"):
        await beat(bundle, pacers[0], w, T0, {**COOL, **FULL})
    got = {w: await bundle.claim(w, now=T0 + 1, lease_s=300.0) for w in ("a", "b")}
    assert sorted(g.job.job_id for g in got.values()) == sorted(p3s)
    p0 = await bundle.enqueue(now=T0 + 39, priority=0)
    both = await asyncio.gather(*(beat(bundle, pacers[i], w, T0 + 40, {**COOL, **FULL})
                                  for i, w in enumerate(("a", "b"))))
    done = [p for hb in both for p in hb.preempted]
    assert len(done) == 1 and done[0][0] == p0
    vacating = [a for hb in both for a in hb.result.actions if a.action == "vacate"]
    assert [a.job_id for a in vacating] == [done[0][1]]
    waiter = await bundle.store.get_job(p0, now=T0 + 41)
    assert [e.reason for e in waiter.events].count(
        f"reserved on {done[0][2]}: waits for P3 job {done[0][1]} to vacate") == 1


async def test_a_scan_skips_while_another_session_holds_the_preemption_lock(bundle, request):
    """PostgreSQL only (its sessions write at once; SQLite has one writer): while another
    session's scan holds the preemption lock a heartbeat preempts nothing, and the next
    scan does."""
    if bundle.kind != "postgres":
        pytest.skip("the preemption lock is PostgreSQL's (SQLite: one writer)")
    import asyncpg
    from coordd.store.postgres.governance import PREEMPT_LOCK_KEY, SQL_PREEMPT_LOCK
    await bundle.enqueue(priority=3)
    await beat(bundle, gov(), "a", T0, {**COOL, **FULL})
    await bundle.claim("a", now=T0 + 1, lease_s=300.0)
    p0 = await bundle.enqueue(now=T0 + 39, priority=0)
    other = await asyncpg.connect(request.getfixturevalue("pg_dsn"))
    try:
        async with other.transaction():
            assert await other.fetchval(SQL_PREEMPT_LOCK, PREEMPT_LOCK_KEY)
            busy = await beat(bundle, gov(), "a", T0 + 40, {**COOL, **FULL})
            assert busy.preempted == [] and busy.result.actions[0].action == "continue"
    finally:
        await other.close()
    free = await beat(bundle, gov(), "a", T0 + 41, {**COOL, **FULL})
    assert [p[0] for p in free.preempted] == [p0]
