"""Admission over both stores: fleet-wide limits (concurrency held and freed however the
lease ends, the P0 reserve, the rate window, budgets), priority aging, per-job gate
overrides and result schemas. The same bodies pass on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from coordd import config as config_mod
from coordd.rules import gates
from coordd.store.sqlite import leases
from coordd.rules import limits
from coordd.rules.limits import LimitBook, LimitSpec
from coordd.store.api import LeaseRef
from tests.store.conftest import T0


def book(**specs: dict) -> LimitBook:
    return LimitBook({n: LimitSpec(**s) for n, s in specs.items()})


def policy(lb: LimitBook | None = None, aging_s: float = 0.0) -> leases.ClaimPolicy:
    cfg = config_mod.load(None)
    return leases.ClaimPolicy(policies=cfg.policies(), heartbeat_stale_s=cfg.heartbeat_stale_s,
                              aging_interval_s=aging_s, limits=lb)


def ref(got, worker_id: str) -> LeaseRef:
    return LeaseRef(got.job.job_id, worker_id, got.lease.token)


async def limited(bundle, lb: LimitBook, n: int = 1, now: float = T0, **kw) -> list[str]:
    bundle.policy = policy(lb)
    uses = kw.pop("limits", [("gpu", 1)])
    return [await bundle.enqueue(now=now, limits=uses, **kw) for _ in range(n)]


async def test_concurrency_limit_is_held_and_freed_on_complete_fail_and_expiry(bundle):
    lb = book(gpu={"concurrency": 1})
    ids = await limited(bundle, lb, n=4)
    for w in "abcde":
        await bundle.worker(w, now=T0)
    got = await bundle.claim("a", now=T0 + 1)
    refused = await bundle.claim("b", now=T0 + 1)
    assert refused.job is None and refused.reasons == [limits.LIMIT_REFUSED]
    assert refused.detail == "limit gpu: 1/1 running"
    waiting = [j for j in ids if j != got.job.job_id][0]
    assert await bundle.store.job_limits(waiting, 2, True, lb, now=T0 + 1) == (
        [("gpu", 1)], "limit gpu: 1/1 running")  # a waiting job's reason (get_job)
    assert await bundle.store.job_limits(got.job.job_id, 2, False, lb, now=T0 + 1) == (
        [("gpu", 1)], None)
    views, _ = await bundle.store.limit_views(lb, ["gpu"], True, now=T0 + 1)
    assert views[0].used == 1 and [h.job_id for h in views[0].holders] == [got.job.job_id]
    await bundle.store.complete(ref(got, "a"), '"ok"', now=T0 + 2)  # freed on complete
    got = await bundle.claim("b", now=T0 + 2)
    assert got.job is not None and (await bundle.claim("c", now=T0 + 2)).job is None
    await bundle.store.fail(ref(got, "b"), "boom", False, lambda n: 0.0, now=T0 + 3)  # on fail
    got = await bundle.claim("c", now=T0 + 3, lease_s=5.0)
    assert got.job is not None and (await bundle.claim("d", now=T0 + 4)).job is None
    assert await bundle.store.reap(now=T0 + 9) == 1  # on expiry
    await bundle.worker("d", now=T0 + 9)
    assert (await bundle.claim("d", now=T0 + 9)).job is not None
    views, _ = await bundle.store.limit_views(lb, ["gpu"], True, now=T0 + 9)
    assert views[0].used == 1 and views[0].waiting == 1


async def test_a_job_without_limits_passes_a_full_limit(bundle):
    """No head-of-line blocking: the claim skips the limited jobs (more than one page of
    candidates) for the free one behind them."""
    lb = book(gpu={"concurrency": 1})
    first, *_ = await limited(bundle, lb, n=40)
    free = await bundle.enqueue(limits=[])
    await bundle.worker("a")
    assert (await bundle.claim("a", now=T0 + 1)).job.job_id == first
    assert (await bundle.claim("a", now=T0 + 1)).job.job_id == free


async def test_reserve_keeps_a_unit_for_p0(bundle):
    lb = book(gpu={"concurrency": 2, "reserve": {"p0": 1}})
    await limited(bundle, lb, n=2, priority=2)
    await bundle.worker("a")
    assert (await bundle.claim("a", now=T0 + 1)).job.priority == 2
    refused = await bundle.claim("a", now=T0 + 1)
    assert refused.job is None and refused.detail == "limit gpu: 1/2 running (1 kept for P0)"
    p0 = await bundle.enqueue(priority=0, limits=[("gpu", 1)])
    assert (await bundle.claim("a", now=T0 + 2)).job.job_id == p0


async def test_rate_window_on_the_store_clock(bundle):
    lb = book(api={"rate": "2/min"})
    await limited(bundle, lb, n=3, limits=[("api", 1)])
    await bundle.worker("a")
    assert (await bundle.claim("a", now=T0)).job is not None
    assert (await bundle.claim("a", now=T0 + 1)).job is not None
    refused = await bundle.claim("a", now=T0 + 2)
    assert refused.reasons == [limits.LIMIT_REFUSED]
    assert refused.detail == "limit api: rate 2/min, next slot in 58 s"
    assert refused.next_slot_s == pytest.approx(58.0)
    views, _ = await bundle.store.limit_views(lb, ["api"], False, now=T0 + 2)
    assert views[0].rate_used == 2 and views[0].next_slot_s == pytest.approx(58.0)
    await bundle.worker("a", now=T0 + 59.5)
    assert (await bundle.claim("a", now=T0 + 59.5)).job is None
    assert (await bundle.claim("a", now=T0 + 60)).job is not None  # the first claim left


async def test_budget_spent_then_refused_until_the_window_passes(bundle):
    lb = book(llm={"budget": {"tokens": "100/h"}})
    await limited(bundle, lb, n=2, limits=[("llm", 1)])
    await bundle.worker("a")
    got = await bundle.claim("a", now=T0 + 1)
    res = await bundle.store.complete_counted(ref(got, "a"), '"ok"', {"tokens": 150.0}, lb,
                                              lambda n: 0.0, now=T0 + 2)
    assert res.status == "succeeded"
    refused = await bundle.claim("a", now=T0 + 3)
    assert refused.job is None and refused.detail == "limit llm: budget tokens 150/100/h used"
    views, _ = await bundle.store.limit_views(lb, ["llm"], False, now=T0 + 3)
    assert views[0].budget_used == {"tokens": 150.0}
    await bundle.worker("a", now=T0 + 3603)
    assert (await bundle.claim("a", now=T0 + 3603)).job is not None


async def test_runtime_override_is_stored_and_read_back(bundle):
    await bundle.store.set_limit_override("gpu", {"concurrency": 3}, False, now=T0)
    assert await bundle.store.limit_overrides() == [("gpu", {"concurrency": 3})]
    await bundle.store.set_limit_override("gpu", None, True, now=T0 + 1)
    assert await bundle.store.limit_overrides() == []


async def test_sixteen_concurrent_claimers_never_exceed_the_concurrency(bundle):
    """Real concurrent claims (on PostgreSQL, 16 sessions of the pool): at no moment do
    more than N jobs hold the limit, and every job runs once."""
    n_cap, n_jobs = 3, 48
    lb = book(gpu={"concurrency": n_cap})
    bundle.policy = policy(lb)
    await bundle.store.enqueue([msgspec.structs.replace(bundle.job(), limits=[("gpu", 1)])
                                for _ in range(n_jobs)], now=T0)
    running, peak, done = 0, 0, []
    workers = [f"w{i}" for i in range(16)]
    for w in workers:
        await bundle.worker(w, now=T0)

    async def claimer(w: str) -> None:
        nonlocal running, peak
        idle = 0
        while idle < 40:
            got = await bundle.store.claim(w, 30.0, bundle.policy, now=T0 + 1)
            if got.job is None:
                idle += 1
                await asyncio.sleep(0.002)
                continue
            idle = 0
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.03)  # held while the others claim
            running -= 1
            done.append(got.job.job_id)
            await bundle.store.complete(ref(got, w), '"ok"', now=T0 + 1)
    await asyncio.wait_for(asyncio.gather(*(claimer(w) for w in workers)), 60)
    assert peak <= n_cap
    assert sorted(done) == sorted(set(done)) and len(done) == n_jobs


async def test_aging_lets_an_old_p3_pass_a_young_p2(bundle):
    old = await bundle.enqueue(now=T0, priority=3)
    young = await bundle.enqueue(now=T0 + 25, priority=2)
    await bundle.worker("a", now=T0 + 30)
    strict = await bundle.store.claim("a", 30.0, policy(), now=T0 + 30)
    assert strict.job.job_id == young
    await bundle.store.release(ref(strict, "a"), "again", now=T0 + 30)
    aged = await bundle.store.claim("a", 30.0, policy(aging_s=10.0), now=T0 + 30)
    assert aged.job.job_id == old  # P3 - 3 steps = P0 beats P2 - 0 steps


async def test_per_job_gate_override_refuses_and_admits(bundle):
    strict = msgspec.structs.replace(bundle.job(priority=2),
                                     gates_json='{"max_memory_pct": 30}')
    await bundle.store.enqueue([strict], now=T0)
    await bundle.worker("a", memory_used_pct=40.0)
    refused = await bundle.claim("a", now=T0 + 1)
    assert refused.job is None and refused.reasons == [gates.MEMORY_HIGH]
    loose = msgspec.structs.replace(bundle.job(priority=2),
                                    gates_json='{"max_memory_pct": 95}')
    await bundle.store.enqueue([loose], now=T0 + 1)
    await bundle.worker("a", now=T0 + 2, memory_used_pct=90.0)  # the P2 level refuses
    assert (await bundle.claim("a", now=T0 + 2)).job.job_id == loose.job_id


async def test_result_schema_violation_is_refused_then_a_good_result_stored(bundle):
    await bundle.store.enqueue([msgspec.structs.replace(bundle.job(), result_schema="claims")],
                               now=T0)
    await bundle.worker("a")
    got = await bundle.claim("a", now=T0 + 1)
    bad = await bundle.store.complete(ref(got, "a"), '{"claims": [{"text": "x", '
                                      '"label": "fact"}]}', now=T0 + 2)
    assert bad.status == "waiting" and bad.error.startswith("result_invalid (claims): ")
    view = await bundle.store.get_job(got.job.job_id, now=T0 + 2)
    assert view.status == "waiting" and view.events[-1].to_status == "waiting"
    again = await bundle.claim("a", now=T0 + 3)
    good = await bundle.store.complete(ref(again, "a"), '{"claims": [{"text": "x", '
                                       '"label": " Opinion"}]}', now=T0 + 4)
    assert good.status == "succeeded" and good.error is None
    view = await bundle.store.get_job(got.job.job_id, now=T0 + 4)
    assert view.result == {"claims": [{"text": "x", "label": "opinion", "evidence": []}],
                           "evidence": [], "title": None}


async def test_the_limits_methods_over_either_store(bundle):
    """The RPC layer over the store interface (the Coordinator, as coordd runs):
    an unknown limit is bad_request at enqueue, the limits methods answer alike."""
    from coordd import errors
    from coordd.clock import FakeClock
    from coordd.wire.protocol import Enqueue
    from coordd.wire.limits import LimitReset, LimitSet, LimitsQuery
    from coordd.service import Coordinator
    cfg = config_mod.load(None, limits={"gpu": {"concurrency": 1}})
    coord = Coordinator(bundle.store, cfg, FakeClock(T0))
    await coord.load_limits()
    with pytest.raises(errors.BadRequest, match="unknown limit 'nope' \\(known: gpu\\)"):
        await coord.enqueue(Enqueue(kind="k", required_role="cpu", priority=1, payload={},
                                    limits=["nope"]))
    await coord.enqueue(Enqueue(kind="k", required_role="cpu", priority=1, payload={},
                                limits=["gpu"]))
    view = await coord.limits_set(LimitSet(name="gpu", settings={"concurrency": 2}))
    assert view.source == "config+runtime" and view.concurrency == 2 and view.waiting == 1
    with pytest.raises(errors.BadRequest):
        await coord.limits_set(LimitSet(name="gpu", settings={"concurrency": -1}))
    with pytest.raises(errors.NotFound):
        await coord.limits(LimitsQuery(name="x"))
    assert (await coord.limits_reset(LimitReset(name="gpu"))).limits[0].concurrency == 1
    with pytest.raises(errors.NotFound, match="no runtime override"):
        await coord.limits_reset(LimitReset(name="gpu"))
