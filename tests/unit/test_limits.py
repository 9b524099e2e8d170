"""Fleet-wide limits (issue 17) on a pinned clock: reserves by priority, the rate window at
its boundaries, every way a lease ends releases its units, two limits both or neither, no
head-of-line blocking behind a full limit, enqueue checks, the waiting reason, runtime
overrides kept over a restart, parked claims woken when a unit frees, kind defaults,
reported usage against a budget. No sleeps make time pass: FakeClock does."""

from __future__ import annotations

import asyncio
import random

import pytest

from coordd import config as config_mod
from coordd import errors
from coordd.store.sqlite import leases
from coordd.clock import FakeClock
from coordd.wire.protocol import Claim, Complete, Fail, JobId, ListJobs
from coordd.wire.limits import LimitReset, LimitSet, LimitsQuery, LimitUse
from coordd.wire.workers import Goodbye, Release
from coordd.wire.workflows import WorkflowId, WorkflowNode, WorkflowSubmit
from coordd.daemon.server import sqlite_coordinator
from coordd.rules.claim_policy import CLAIM_SCAN
from coordd.store import limits as limit_store
from tests.conftest import T0, Bundle

OPENAI = {"openai": {"concurrency": 4, "reserve": {"p0": 1}}}


async def used(b: Bundle, name: str) -> int:
    return (await b.coord.limits(LimitsQuery(name=name))).limits[0].used


async def test_reserve_p3_cannot_take_the_last_reserved_unit_p0_can(make_bundle):
    b = await make_bundle(limits={"openai": {"concurrency": 4, "reserve": {"p0": 1, "p1": 1}}})
    await b.worker("w")
    for _ in range(3):
        await b.enqueue(priority=3, limits=["openai"])
    p1 = await b.enqueue(priority=1, limits=["openai"])
    took = [(await b.claim("w")).job for _ in range(2)]
    assert [j.priority for j in took] == [1, 3]  # P1 first: priority order
    assert took[0].job_id == p1
    third = await b.claim("w")  # P3 may use 4 - 1 - 1 = 2 units: 2 held
    assert third.job is None and third.reasons == ["limit"]
    assert third.detail == "limit openai: 2/4 running (2 kept for P0..P1)"
    p0 = await b.enqueue(priority=0, limits=["openai"])
    got = await b.claim("w")
    assert got.job.job_id == p0  # at once: the reserve was kept for it
    assert (await b.claim("w")).job is None  # 3/4: P3 still may not
    assert await used(b, "openai") == 3


async def test_reserved_units_serve_p1_but_not_p2(make_bundle):
    b = await make_bundle(limits={"gpu": {"concurrency": 3, "reserve": {"p1": 1}}})
    await b.worker("w")
    for _ in range(3):
        await b.enqueue(priority=2, limits=["gpu"])
    assert (await b.claim("w")).job and (await b.claim("w")).job
    assert (await b.claim("w")).job is None  # the last unit is kept for P0..P1
    p1 = await b.enqueue(priority=1, limits=["gpu"])
    assert (await b.claim("w")).job.job_id == p1


async def test_rate_window_exact_at_its_boundaries(make_bundle):
    b = await make_bundle(limits={"api": {"rate": "2/min"}})
    await b.worker("w")
    for _ in range(4):
        await b.enqueue(limits=["api"])
    first = await b.claim("w")
    b.clock.advance(20)
    assert first.job and (await b.claim("w")).job  # claims at t=100 and t=120
    refused = await b.claim("w")
    assert refused.job is None and refused.next_slot_s == 40.0
    assert refused.detail == "limit api: rate 2/min, next slot in 40 s"
    b.clock.advance(39.5)  # t=159.5: the claim of t=100 is still in the window
    await b.worker("w")
    assert (await b.claim("w")).job is None
    b.clock.advance(0.5)  # t=160: it left the window at exactly 100 + 60
    await b.worker("w")
    assert (await b.claim("w")).job is not None
    again = await b.claim("w")  # a rate slot is consumed at claim and not returned
    assert again.job is None and again.next_slot_s == 20.0


async def test_rate_reserve_keeps_claims_for_p0(make_bundle):
    b = await make_bundle(limits={"api": {"rate": "3/h", "reserve": {"p0": 1}}})
    await b.worker("w")
    for _ in range(3):
        await b.enqueue(priority=3, limits=["api"])
    assert (await b.claim("w")).job and (await b.claim("w")).job
    assert (await b.claim("w")).job is None
    p0 = await b.enqueue(priority=0, limits=["api"])
    assert (await b.claim("w")).job.job_id == p0


async def _one_running(b: Bundle):
    await b.worker("w")
    await b.enqueue(limits=["openai"], max_attempts=3)
    res = await b.claim("w", lease_s=30.0)
    assert res.job is not None and await used(b, "openai") == 1
    return res


async def end_complete(b, r):
    await b.coord.complete(Complete(job_id=r.job.job_id, worker_id="w", token=r.lease.token))


async def end_fail_retryable(b, r):
    await b.coord.fail(Fail(job_id=r.job.job_id, worker_id="w", token=r.lease.token,
                            error="x", retryable=True))


async def end_fail_permanent(b, r):
    await b.coord.fail(Fail(job_id=r.job.job_id, worker_id="w", token=r.lease.token,
                            error="x", retryable=False))


async def end_expiry(b, r):
    b.clock.advance(31)
    assert (await b.coord.reap()).reaped == 1


async def end_vacate(b, r):
    await b.coord.release(Release(job_id=r.job.job_id, worker_id="w", token=r.lease.token,
                                  reason="vacate: preempted"))


async def end_cancel(b, r):
    await b.coord.cancel(JobId(job_id=r.job.job_id))  # running: requested, still held
    assert await used(b, "openai") == 1
    await end_complete(b, r)  # the holder ends it: cancelled
    assert (await b.coord.get_job(JobId(job_id=r.job.job_id))).status == "cancelled"


async def end_worker_lost(b, r):
    await b.coord.goodbye(Goodbye(worker_id="w"))


@pytest.mark.parametrize("end", [end_complete, end_fail_retryable, end_fail_permanent,
                                 end_expiry, end_vacate, end_cancel, end_worker_lost])
async def test_every_lease_end_releases_its_units(make_bundle, end):
    b = await make_bundle(limits=OPENAI)
    res = await _one_running(b)
    await end(b, res)
    assert await used(b, "openai") == 0
    view = (await b.coord.limits(LimitsQuery(name="openai"))).limits[0]
    assert view.holders == []


async def test_a_job_with_two_limits_takes_both_or_neither(make_bundle):
    b = await make_bundle(limits={"a": {"concurrency": 2}, "b": {"concurrency": 1}})
    await b.worker("w")
    both = await b.enqueue(limits=["a", LimitUse(name="b")])
    other = await b.enqueue(limits=["b"])
    a_only = await b.enqueue(limits=[LimitUse(name="a", units=1)])
    assert (await b.claim("w")).job.job_id == both
    assert (await used(b, "a"), await used(b, "b")) == (1, 1)
    got = await b.claim("w")  # `other` is blocked by b; a_only still fits a
    assert got.job.job_id == a_only
    assert (await b.claim("w")).job is None
    # a blocked job with two limits holds nothing of the one that had room
    b2 = await make_bundle(limits={"a": {"concurrency": 2}, "b": {"concurrency": 1}})
    await b2.worker("w")
    await b2.enqueue(limits=["b"])
    await b2.claim("w")
    await b2.enqueue(limits=["a", "b"])
    assert (await b2.claim("w")).job is None
    assert (await used(b2, "a"), await used(b2, "b")) == (0, 1)
    assert other


async def test_units_weigh(make_bundle):
    b = await make_bundle(limits={"nas": {"concurrency": 3}})
    await b.worker("w")
    await b.enqueue(limits=[LimitUse(name="nas", units=2)])
    await b.enqueue(limits=[LimitUse(name="nas", units=2)])
    one = await b.enqueue(limits=["nas"])
    assert (await b.claim("w")).job
    assert (await b.claim("w")).job.job_id == one  # 2 + 2 > 3; 2 + 1 fits
    assert await used(b, "nas") == 3


async def test_no_head_of_line_blocking_behind_a_full_limit(make_bundle):
    b = await make_bundle(limits={"openai": {"concurrency": 1}})
    await b.worker("w")
    for _ in range(CLAIM_SCAN + 20):  # more than a level's scan waits ahead, all blocked
        await b.enqueue(priority=2, limits=["openai"])
    free = await b.enqueue(priority=2)
    assert (await b.claim("w")).job is not None  # takes the one unit
    got = await b.claim("w")
    assert got.job is not None and got.job.job_id == free


async def test_no_head_of_line_blocking_with_aging(make_bundle):
    b = await make_bundle(limits={"openai": {"concurrency": 1}}, aging_interval_s=600.0)
    await b.worker("w")
    for _ in range(CLAIM_SCAN + 5):
        await b.enqueue(priority=1, limits=["openai"])
    free = await b.enqueue(priority=1)  # same level, behind every blocked one
    assert (await b.claim("w")).job.priority == 1
    got = await b.claim("w")
    assert got.job is not None and got.job.job_id == free


async def test_enqueue_checks_the_limits_it_names(make_bundle):
    b = await make_bundle(limits=OPENAI)
    with pytest.raises(errors.BadRequest, match="unknown limit 'anthropic'.*known: openai"):
        await b.enqueue(limits=["anthropic"])
    with pytest.raises(errors.BadRequest, match="can never run"):
        await b.enqueue(limits=[LimitUse(name="openai", units=5)])
    with pytest.raises(errors.BadRequest, match="named twice"):
        await b.enqueue(limits=["openai", "openai"])
    with pytest.raises(errors.BadRequest, match="units"):
        await b.enqueue(limits=[LimitUse(name="openai", units=0)])
    with pytest.raises(errors.BadRequest, match="unknown limit"):
        await b.coord.workflow_submit(WorkflowSubmit(name="wf", nodes=[WorkflowNode(
            name="a", kind="k", required_role="cpu", limits=["nope"])]))
    assert (await b.coord.status()).jobs["waiting"] == 0


async def test_workflow_nodes_consume_their_limits(make_bundle):
    b = await make_bundle(limits={"openai": {"concurrency": 1}})
    await b.worker("w")
    sub = await b.coord.workflow_submit(WorkflowSubmit(name="wf", nodes=[
        WorkflowNode(name=n, kind="k", required_role="cpu", limits=["openai"])
        for n in ("a", "b")]))
    assert (await b.claim("w")).job is not None
    assert (await b.claim("w")).reasons == ["limit"]
    wf = await b.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    waiting = [n for n in wf.nodes if n.status == "waiting"]
    assert [n.reason for n in waiting] == ["limit openai: 1/1 running"]


async def test_kind_default_limits(make_bundle):
    b = await make_bundle(limits={"openai": {"concurrency": 1}}, kind_limits={"chat": ["openai"]})
    await b.worker("w")
    await b.enqueue(kind="chat")
    await b.enqueue(kind="chat")
    mine = await b.enqueue(kind="chat", limits=[])  # [] = none, the default not taken
    assert (await b.claim("w")).job is not None
    assert (await b.claim("w")).job.job_id == mine
    view = await b.coord.get_job(JobId(job_id=mine))
    assert view.limits == []


async def test_waiting_reason_names_the_limit(make_bundle):
    b = await make_bundle(limits={"openai": {"concurrency": 1, "rate": "2/min"}})
    await b.worker("w")
    ids = [await b.enqueue(limits=["openai"]) for _ in range(3)]
    r = await b.claim("w")
    job = await b.coord.get_job(JobId(job_id=ids[1]))
    assert job.waiting_reason == "limit openai: 1/1 running"
    assert job.limits == [LimitUse(name="openai", units=1)]
    await end_complete(b, r)
    await b.claim("w")
    job = await b.coord.get_job(JobId(job_id=ids[2]))
    assert job.waiting_reason == ("limit openai: 1/1 running; rate 2/min, "
                                  "next slot in 60 s")
    listed = await b.coord.list_jobs(ListJobs(status="waiting"))
    assert listed.jobs[0].waiting_reason == job.waiting_reason


async def test_runtime_override_is_kept_over_a_restart(make_bundle, tmp_path):
    b = await make_bundle(limits=OPENAI)
    await b.worker("w")
    view = await b.coord.limits_set(LimitSet(name="openai", settings={"concurrency": 1}))
    assert (view.concurrency, view.source, view.reserve) == (1, "config+runtime", {"p0": 1})
    with pytest.raises(errors.BadRequest, match="reserve adds up to 2, more than its "
                       "concurrency 1"):
        await b.coord.limits_set(LimitSet(name="openai", settings={"reserve": {"p0": 2}}))
    assert b.coord.limit_book.defs["openai"].reserve == (1, 0, 0)  # nothing changed
    await b.coord.limits_set(LimitSet(name="extra", settings={"rate": "5/s"}))
    await b.coord.close()
    cfg = config_mod.load(None, limits=OPENAI)
    again = sqlite_coordinator(b.db_path, cfg, FakeClock(T0), rng=random.Random(1))
    await again.start()
    try:
        got = {v.name: v for v in (await again.limits(LimitsQuery())).limits}
        assert got["openai"].concurrency == 1 and got["extra"].rate == "5/s"
        assert got["extra"].source == "runtime"
        await again.limits_reset(LimitReset(name="openai"))
        assert (await again.limits(LimitsQuery(name="openai"))).limits[0].concurrency == 4
        await again.limits_reset(LimitReset(name="extra"))
        with pytest.raises(errors.NotFound):
            await again.limits(LimitsQuery(name="extra"))
    finally:
        await again.close()


async def test_parked_claim_wakes_when_a_unit_frees(make_bundle):
    b = await make_bundle(limits={"openai": {"concurrency": 1}})
    await b.worker("w1")
    await b.worker("w2")
    await b.enqueue(limits=["openai"])
    second = await b.enqueue(limits=["openai"])
    held = await b.claim("w1")
    t = asyncio.ensure_future(b.coord.claim(Claim(worker_id="w2", wait_s=60.0)))
    for _ in range(2000):
        await asyncio.sleep(0)
        if b.coord.push.sleeping == 1:
            break
    assert not t.done()
    await b.coord.complete(Complete(job_id=held.job.job_id, worker_id="w1",
                                    token=held.lease.token))
    got = await asyncio.wait_for(t, 5)
    assert got.job is not None and got.job.job_id == second


async def test_parked_claim_looks_again_when_a_rate_slot_frees(make_bundle):
    b = await make_bundle(limits={"api": {"rate": "1/min"}})
    await b.worker("w")
    await b.enqueue(limits=["api"])
    second = await b.enqueue(limits=["api"])
    assert (await b.claim("w")).job
    t = asyncio.ensure_future(b.coord.claim(Claim(worker_id="w", wait_s=120.0)))
    for _ in range(2000):
        await asyncio.sleep(0)
        if b.coord.push.sleeping == 1:
            break
    b.clock.advance(30)
    await b.worker("w")
    for _ in range(50):
        await asyncio.sleep(0)
    assert not t.done()
    b.clock.advance(31)
    await b.worker("w")
    got = await asyncio.wait_for(t, 5)
    assert got.job is not None and got.job.job_id == second


async def test_budget_of_reported_usage_with_a_share_kept_for_p0(make_bundle):
    b = await make_bundle(limits={"llm": {"budget": {"tokens": "1000/day"},
                                          "budget_reserve": {"p0": 0.5}}})
    await b.worker("w")
    for _ in range(3):
        await b.enqueue(priority=3, limits=["llm"])
    r = await b.claim("w")
    await b.coord.complete(Complete(job_id=r.job.job_id, worker_id="w", token=r.lease.token,
                                    usage={"tokens": 600}))
    refused = await b.claim("w")  # 600 >= 1000 * (1 - 0.5): P3's share is spent
    assert refused.job is None
    assert refused.detail == "limit llm: budget tokens 600/1000/day used (50% kept for P0)"
    p0 = await b.enqueue(priority=0, limits=["llm"])
    assert (await b.claim("w")).job.job_id == p0
    b.clock.advance(86400)
    await b.worker("w")
    assert (await b.claim("w")).job.priority == 3  # a new window
    with pytest.raises(errors.BadRequest, match="usage"):
        await b.coord.complete(Complete(job_id=r.job.job_id, worker_id="w", token=1,
                                        usage={"tokens": float("nan")}))


async def test_no_limit_work_on_the_claim_without_limits(make_bundle, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("limit check on a claim with no limits defined")
    monkeypatch.setattr(limit_store, "ClaimLimits", refuse)
    monkeypatch.setattr(leases.limit_store, "ClaimLimits", refuse)
    b = await make_bundle()
    await b.worker("w")
    await b.enqueue()
    assert (await b.claim("w")).job is not None


def test_config_refuses_bad_limits():
    for bad, msg in [({"x": {"rate": "5/week"}}, "rate must look like"),
                     ({"x": {"concurrency": 0}}, "concurrency must be"),
                     ({"x": {"concurrency": 2, "reserve": {"p3": 1}}}, "use p0..p2"),
                     ({"x": {"concurrency": 2, "reserve": {"p0": 3}}}, "adds up to 3"),
                     ({"x": {"burst": 1}}, "burst")]:
        with pytest.raises(errors.ConfigError, match=msg):
            config_mod.load(None, limits=bad)
    with pytest.raises(errors.ConfigError, match="kind_limits.chat: unknown limit"):
        config_mod.load(None, kind_limits={"chat": ["openai"]})


async def test_limit_gauges_in_metrics(make_bundle):
    b = await make_bundle(limits={"openai": {"concurrency": 8, "rate": "120/min",
                                             "reserve": {"p0": 3, "p1": 1}}})
    await b.worker("w")
    for _ in range(3):
        await b.enqueue(priority=3, limits=["openai"])
    await b.claim("w")
    text = (await b.coord.metrics()).text
    for line in ('coordd_limit_units{limit="openai",state="used"} 1.0',
                 'coordd_limit_units{limit="openai",state="max"} 8.0',
                 'coordd_limit_rate_units{limit="openai",state="used"} 1.0',
                 'coordd_limit_rate_units{limit="openai",state="max"} 120.0',
                 'coordd_limit_usable{limit="openai",priority="0"} 7.0',
                 'coordd_limit_usable{limit="openai",priority="3"} 3.0',
                 'coordd_limit_waiting_jobs{limit="openai"} 2.0'):
        assert line in text, line


@pytest.mark.parametrize("step", [-3600.0, 40.0])
async def test_rate_window_keeps_its_length_over_a_clock_step(make_bundle, step):
    b = await make_bundle(limits={"api": {"rate": "1/min"}})
    await b.worker("w")
    await b.enqueue(limits=["api"])
    await b.enqueue(limits=["api"])
    assert (await b.claim("w")).job is not None  # t=100
    b.clock.jump_wall(step)  # NTP: the claim's time moves with coordd's clock
    b.clock.advance(30)
    await b.worker("w")
    refused = await b.claim("w")  # 30 s of real time since the claim: still in the window
    assert refused.job is None and refused.next_slot_s == 30.0
    b.clock.advance(30)
    await b.worker("w")
    assert (await b.claim("w")).job is not None


async def test_a_stored_override_that_no_longer_fits_the_config_is_skipped(make_bundle, caplog):
    b = await make_bundle(limits={"openai": {"concurrency": 4}})
    await b.coord.limits_set(LimitSet(name="openai", settings={"reserve": {"p0": 3}}))
    await b.coord.close()
    cfg = config_mod.load(None, limits={"openai": {"concurrency": 2}})  # edited file
    again = sqlite_coordinator(b.db_path, cfg, FakeClock(T0), rng=random.Random(1))
    await again.start()
    try:
        view = (await again.limits(LimitsQuery(name="openai"))).limits[0]
        assert (view.concurrency, view.reserve, view.source) == (2, {}, "config")
        assert "runtime override of limit openai ignored" in caplog.text
    finally:
        await again.close()


async def test_a_preemption_reservation_does_not_pass_a_full_limit(make_bundle):
    from coordd.store.governance import SQL_INSERT_RESERVATION
    b = await make_bundle(limits={"openai": {"concurrency": 1}})
    await b.worker("w1")
    await b.worker("w2")
    await b.enqueue(priority=0, limits=["openai"])
    held = await b.claim("w1")
    promised = await b.enqueue(priority=0, limits=["openai"])
    free = await b.enqueue(priority=3)
    await b.coord.store.writer.run(lambda conn, now: conn.execute(
        SQL_INSERT_RESERVATION, (promised, "w2", held.job.job_id, now, now + 60)))
    got = await b.claim("w2")  # the promised job's limit is full: the claim goes on
    assert got.job is not None and got.job.job_id == free
    assert await used(b, "openai") == 1
    await b.coord.complete(Complete(job_id=held.job.job_id, worker_id="w1",
                                    token=held.lease.token))
    await b.worker("w2")
    assert (await b.claim("w2")).job.job_id == promised  # still reserved, now with room
