"""Fewer round trips per job (issue 30 item 1), on both stores: a claim of up to
`max_jobs` jobs, and the next claim a `complete`, `fail` or `release` makes in the same call
(coordd.service.dispatch over each store's one claim). Fencing, priority order, gates and
limits hold per job exactly as for single claims."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from coordd import config as config_mod
from coordd import errors
from coordd.clock import FakeClock
from coordd.rules import gates
from coordd.rules.limits import LIMIT_REFUSED, LimitSpec
from coordd.service import Coordinator
from coordd.store.sqlite.store import SQLiteStore
from coordd.wire.claims import ClaimAsk
from coordd.wire.protocol import Claim, Complete, Enqueue, Fail, Heartbeat
from coordd.wire.workers import Release
from tests.store.conftest import COOL, T0


@pytest.fixture(params=["sqlite", "postgres"])
async def coord(request: Any, tmp_path: Any) -> Any:
    """A started Coordinator over a fresh store of each kind, with a limit `gpu` of 2 and
    preemption from the first second of a run."""
    clock = FakeClock(T0)
    if request.param == "sqlite":
        st: Any = SQLiteStore(str(tmp_path / "c.db"), clock)
    else:
        from coordd.store.postgres import PostgresStore
        st = PostgresStore(request.getfixturevalue("pg_dsn"))
    cfg = config_mod.load(None, limits={"gpu": LimitSpec(concurrency=2)},
                          preempt_min_runtime_s=0.0)
    c = Coordinator(st, cfg, clock)
    await c.start()
    if request.param == "postgres":
        await st.truncate()
    try:
        yield c
    finally:
        await c.close()


async def beat(c: Any, worker_id: str = "w1", **readings: Any) -> None:
    await c.heartbeat(Heartbeat(worker_id=worker_id, roles=["cpu"],
                                readings={**COOL, **readings}))


async def enqueue(c: Any, priority: int = 2, **kw: Any) -> str:
    return (await c.enqueue(Enqueue(kind=kw.pop("kind", "k"), required_role="cpu",
                                    priority=priority, payload={}, **kw))).job_id


def granted(res: Any) -> list[tuple[str, int]]:
    """(job id, fencing token) of every job a ClaimResult holds, in order."""
    if res is None or res.job is None:
        return []
    return [(res.job.job_id, res.lease.token), *((g.job.job_id, g.lease.token) for g in res.more)]


async def test_a_batch_claim_takes_jobs_in_priority_order_each_with_its_lease(coord):
    await beat(coord)
    p2 = [await enqueue(coord, 2) for _ in range(2)]
    p0 = await enqueue(coord, 0)
    p1 = await enqueue(coord, 1)
    res = await coord.claim(Claim(worker_id="w1", lease_s=30, max_jobs=3))
    got = granted(res)
    assert [j for j, _ in got] == [p0, p1, p2[0]]  # the order of three single claims
    assert all(g.lease.lease_s == 30 for g in res.more)
    for job_id, token in got:  # each its own lease, fenced by its own token
        view = await coord.get_job(_id(job_id))
        assert view.status == "running" and view.lease.token == token
    await coord.complete(Complete(job_id=got[1][0], worker_id="w1", token=got[1][1]))
    with pytest.raises((errors.LeaseLost, errors.NotFound, errors.AlreadyCompleted)):
        await coord.complete(Complete(job_id=got[2][0], worker_id="w1", token=got[2][1] + 1))
    rest = await coord.claim(Claim(worker_id="w1", max_jobs=5))
    assert [j for j, _ in granted(rest)] == [p2[1]] and rest.reasons == []


def _id(job_id: str) -> Any:
    from coordd.wire.protocol import GetJob
    return GetJob(job_id=job_id)


async def test_a_batch_claim_honours_a_limit_per_job(coord):
    await beat(coord)
    ids = [await enqueue(coord, limits=["gpu"]) for _ in range(4)]
    res = await coord.claim(Claim(worker_id="w1", max_jobs=4))
    assert [j for j, _ in granted(res)] == ids[:2]  # a limit with 2 left hands out 2
    assert res.reasons == [LIMIT_REFUSED]  # why the batch stopped there
    assert (await coord.claim(Claim(worker_id="w1", max_jobs=4))).job is None


async def test_a_repeated_batch_claim_id_returns_the_same_leases(coord):
    await beat(coord)
    for _ in range(3):
        await enqueue(coord)
    first = granted(await coord.claim(Claim(worker_id="w1", claim_id="c1", max_jobs=2)))
    again = granted(await coord.claim(Claim(worker_id="w1", claim_id="c1", max_jobs=2)))
    assert len(first) == 2 and again == first


async def test_max_jobs_out_of_range_is_refused_before_anything_is_written(coord):
    await beat(coord)
    job_id = await enqueue(coord)
    for bad in (0, 65):
        with pytest.raises(errors.BadRequest, match="max_jobs must be 1..64"):
            await coord.claim(Claim(worker_id="w1", max_jobs=bad))
    got = await coord.claim(Claim(worker_id="w1"))
    with pytest.raises(errors.BadRequest, match="max_jobs"):
        await coord.complete(Complete(job_id=got.job.job_id, worker_id="w1",
                                      token=got.lease.token, next=ClaimAsk(max_jobs=0)))
    assert (await coord.get_job(_id(job_id))).status == "running"  # not completed


async def test_a_bad_next_lease_s_is_refused_by_its_name_before_anything_is_written(coord):
    await beat(coord)
    job_id = await enqueue(coord)
    await enqueue(coord)
    got = await coord.claim(Claim(worker_id="w1"))
    for bad in (0.0, -1.0, float("inf"), float("nan"), 10 ** 12):
        with pytest.raises(errors.BadRequest, match=r"^next\.lease_s must be > 0"):
            await coord.complete(Complete(job_id=got.job.job_id, worker_id="w1",
                                          token=got.lease.token, next=ClaimAsk(lease_s=bad)))
    assert (await coord.get_job(_id(job_id))).status == "running"  # not completed
    res = await coord.complete(Complete(job_id=got.job.job_id, worker_id="w1",
                                        token=got.lease.token, next=ClaimAsk(lease_s=1e-3)))
    assert res.next.lease.lease_s == coord.config.lease_min_s  # clamped, as a claim's


async def test_complete_with_next_hands_out_the_next_job(coord):
    await beat(coord)
    a, b = await enqueue(coord), await enqueue(coord)
    got = await coord.claim(Claim(worker_id="w1"))
    assert got.job.job_id == a
    res = await coord.complete(Complete(job_id=a, worker_id="w1", token=got.lease.token,
                                        result={"ok": 1}, next=ClaimAsk(lease_s=40)))
    assert res.status == "succeeded"
    assert res.next is not None and res.next.job.job_id == b and res.next.lease.lease_s == 40
    view = await coord.get_job(_id(b))
    assert view.status == "running" and view.lease.token == res.next.lease.token
    last = await coord.complete(Complete(job_id=b, worker_id="w1", token=res.next.lease.token,
                                         next=ClaimAsk()))
    assert last.next is not None and last.next.job is None  # nothing due: park a claim


async def test_a_stale_token_complete_with_next_hands_out_nothing(coord):
    await beat(coord)
    a = await enqueue(coord)
    old = await coord.claim(Claim(worker_id="w1"))
    await coord.release(Release(job_id=a, worker_id="w1", token=old.lease.token))
    new = await coord.claim(Claim(worker_id="w1"))  # the same job, a newer fencing token
    assert new.job.job_id == a and new.lease.token > old.lease.token
    waiting = await enqueue(coord)
    stale = dict(job_id=a, worker_id="w1", token=old.lease.token, next=ClaimAsk())
    for call in (coord.complete(Complete(**stale)), coord.fail(Fail(**stale)),
                 coord.release(Release(**stale))):
        with pytest.raises(errors.LeaseLost):
            await call
    assert (await coord.get_job(_id(waiting))).status == "waiting"  # nothing handed out
    assert (await coord.get_job(_id(a))).lease.token == new.lease.token


async def test_complete_with_next_respects_gates(coord):
    await beat(coord)
    a = await enqueue(coord)
    gated = await enqueue(coord, gates={"max_memory_pct": 50.0})
    got = await coord.claim(Claim(worker_id="w1"))
    await beat(coord, memory_used_pct=80.0)  # the next job's own gate closes
    res = await coord.complete(Complete(job_id=a, worker_id="w1", token=got.lease.token,
                                        next=ClaimAsk()))
    assert res.status == "succeeded" and res.next.job is None
    assert gates.MEMORY_HIGH in res.next.reasons
    assert (await coord.get_job(_id(gated))).status == "waiting"


async def test_fail_and_release_with_next_claim_by_priority(coord):
    await beat(coord)
    a = await enqueue(coord, 2)
    got = await coord.claim(Claim(worker_id="w1"))
    p3, p1 = await enqueue(coord, 3), await enqueue(coord, 1)
    failed = await coord.fail(Fail(job_id=a, worker_id="w1", token=got.lease.token,
                                   error="boom", retryable=False, next=ClaimAsk()))
    assert failed.status == "failed" and failed.next.job.job_id == p1
    released = await coord.release(Release(job_id=p1, worker_id="w1",
                                           token=failed.next.lease.token, reason="vacate",
                                           next=ClaimAsk(kinds=["k"])))
    assert released.status == "waiting"
    assert released.next.job.job_id == p1  # handed back, then the best job again: itself
    assert released.next.lease.token > failed.next.lease.token
    assert (await coord.get_job(_id(p3))).status == "waiting"


def _at(view: Any, to_status: str) -> float:
    """When the job's last transition to `to_status` was logged."""
    return [e.at for e in view.events if e.to_status == to_status][-1]


async def test_the_report_and_its_next_claim_are_one_transaction(coord):
    """Both stores run a report and its next claim in one transaction (SQLite: one writer
    request; PostgreSQL: one transaction, whose clock, now(), is its start): the report's
    event and the next job's claim event carry the same time."""
    await beat(coord)
    a, b, c, d = [await enqueue(coord) for _ in range(4)]
    got = await coord.claim(Claim(worker_id="w1"))
    stats = getattr(getattr(coord.store, "writer", None), "stats", None)
    before = None if stats is None else stats.requests
    res = await coord.complete(Complete(job_id=a, worker_id="w1", token=got.lease.token,
                                        next=ClaimAsk()))
    assert res.next.job.job_id == b
    if stats is not None:
        assert stats.requests - before == 1
    assert _at(await coord.get_job(_id(a)), "succeeded") == \
        _at(await coord.get_job(_id(b)), "running")
    failed = await coord.fail(Fail(job_id=b, worker_id="w1", token=res.next.lease.token,
                                   error="x", retryable=False, next=ClaimAsk()))
    assert failed.next.job.job_id == c
    assert _at(await coord.get_job(_id(b)), "failed") == \
        _at(await coord.get_job(_id(c)), "running")
    released = await coord.release(Release(job_id=c, worker_id="w1",
                                           token=failed.next.lease.token, next=ClaimAsk()))
    taken = released.next.job.job_id
    assert taken in (c, d)  # c queued again at that time (a clock that moved: d first)
    assert _at(await coord.get_job(_id(c)), "waiting") == \
        _at(await coord.get_job(_id(taken)), "running")


async def test_concurrent_completes_with_next_each_get_their_own_job(coord):
    """Eight workers complete with `next` at once (PostgreSQL: batched into shared
    transactions): every job is handed out once, in priority order, each report stored."""
    workers = [f"w{i}" for i in range(8)]
    for w in workers:
        await beat(coord, w)
    first = [await enqueue(coord, 2) for _ in workers]
    held = {}
    for w in workers:
        got = await coord.claim(Claim(worker_id=w))
        held[w] = got
    assert sorted(g.job.job_id for g in held.values()) == sorted(first)
    later = [await enqueue(coord, 3) for _ in workers] + [await enqueue(coord, 1)
                                                          for _ in workers]
    results = await asyncio.gather(*(coord.complete(Complete(
        job_id=g.job.job_id, worker_id=w, token=g.lease.token, next=ClaimAsk()))
        for w, g in held.items()))
    assert all(r.status == "succeeded" for r in results)
    handed = [r.next.job.job_id for r in results]
    assert sorted(handed) == sorted(later[len(workers):])  # the P1s, each once
    for w, r in zip(held, results):
        view = await coord.get_job(_id(r.next.job.job_id))
        assert view.status == "running" and view.lease.worker_id == w
        assert view.lease.token == r.next.lease.token


async def test_a_vacated_jobs_release_with_next_takes_the_reserved_p0(coord):
    """Preemption: a P0 no worker has room for vacates a P3 and holds a reservation on its
    worker; the victim's release with `next` hands the reserved P0 to that worker at once
    (the reservation is used up), and the P3 waits."""
    full = {"slots_total": 1}
    await beat(coord, **full)
    p3 = await enqueue(coord, 3)
    got = await coord.claim(Claim(worker_id="w1", lease_s=300))
    assert got.job.job_id == p3
    p0 = await enqueue(coord, 0)
    hb = await coord.heartbeat(Heartbeat(worker_id="w1", roles=["cpu"],
                                         readings={**COOL, **full}))
    assert [(a.job_id, a.action) for a in hb.actions] == [(p3, "vacate")]
    res = await coord.release(Release(job_id=p3, worker_id="w1", token=got.lease.token,
                                      reason="vacated", next=ClaimAsk(kinds=["k"])))
    assert res.status == "waiting" and res.next.job.job_id == p0
    assert (await coord.get_job(_id(p3))).status == "waiting"
    p0_view = await coord.get_job(_id(p0))
    assert p0_view.lease.token == res.next.lease.token
    assert any((e.reason or "").startswith("reserved on w1") for e in p0_view.events)
    p0_view = await coord.get_job(_id(p0))
    assert p0_view.lease.token == res.next.lease.token
    assert any((e.reason or "").startswith("reserved on w1") for e in p0_view.events)


async def test_a_repeated_next_claim_id_returns_the_lease_it_granted(coord):
    """A worker re-sends a report's next claim with the same claim id (its reply was lost):
    the report is stored and the answer is the lease that claim id already granted, as a
    repeated claim's is; no second job is taken. Once that lease has ended (with the
    report itself, here), the claim id claims anew."""
    await beat(coord)
    a, x, b, y, c = [await enqueue(coord) for _ in range(5)]
    held = [await coord.claim(Claim(worker_id="w1")) for _ in range(2)]
    assert [h.job.job_id for h in held] == [a, x]
    first = await coord.complete(Complete(job_id=a, worker_id="w1", token=held[0].lease.token,
                                          next=ClaimAsk(claim_id="n1")))
    assert first.next.job.job_id == b
    again = await coord.complete(Complete(job_id=x, worker_id="w1", token=held[1].lease.token,
                                          next=ClaimAsk(claim_id="n1")))
    assert again.status == "succeeded"
    assert again.next.job.job_id == b and again.next.lease.token == first.next.lease.token
    assert (await coord.get_job(_id(x))).status == "succeeded"
    got_y = await coord.claim(Claim(worker_id="w1"))
    assert got_y.job.job_id == y
    failed = await coord.fail(Fail(job_id=y, worker_id="w1", token=got_y.lease.token,
                                   error="x", retryable=False, next=ClaimAsk(claim_id="n1")))
    assert failed.status == "failed"
    assert failed.next.job.job_id == b and failed.next.lease.token == first.next.lease.token
    assert (await coord.get_job(_id(c))).status == "waiting"  # no second job taken
    resent = await coord.release(Release(job_id=b, worker_id="w1",
                                         token=first.next.lease.token, next=ClaimAsk(
                                             claim_id="n1")))
    assert resent.status == "waiting"  # n1's lease ended with b: a new claim
    assert granted(resent.next) not in ([], [(b, first.next.lease.token)])
    assert resent.next.job.job_id in (b, c)  # b queued again (a clock that moved: c first)
