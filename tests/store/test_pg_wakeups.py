"""The parked claims' wake-ups on PostgreSQL in one process (coordd.store.postgres.hooks):
a PostgresStore attached to coordd's parked calls (coordd.service.push.Push) on the real
system clock, claims parked through `Push.claim` as the coordinator parks them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from coordd.clock import SystemClock
from coordd.service.push import Push
from coordd.store.api import StoreHooks
from coordd.store.postgres import hooks
from tests.store.conftest import Bundle, policy

COOL = {"memory_used_pct": 10.0}


@pytest.fixture
async def served(pg_dsn: str) -> Any:
    from coordd.store.postgres import PostgresStore
    st = PostgresStore(pg_dsn)
    push = Push(SystemClock(), st)
    st.attach(StoreHooks(policy=policy(), reservations=None, push=push, meters=None,
                         backoff=None))
    await st.start()
    await st.truncate()
    try:
        yield Bundle(store=st, kind="postgres", policy=policy()), push
    finally:
        await push.close()
        await st.close()


async def _parked(b: Bundle, push: Push, wait_s: float = 20.0) -> asyncio.Future[Any]:
    await b.store.heartbeat("w", ["cpu"], COOL)
    fut = asyncio.ensure_future(push.claim(
        "w", None, wait_s, lambda _w: b.store.claim("w", 30.0, b.policy)))
    await asyncio.sleep(0.3)
    await b.store.heartbeat("w", ["cpu"], COOL)  # its roles, for push (`beat_stored`)
    await asyncio.sleep(0.3)  # the roles' change woke it once: it looked and parked again
    assert not fut.done() and push.sleeping == 1
    return fut


async def test_a_job_due_later_wakes_the_parked_claim_at_its_run_at(served):
    """The trigger's `ahead` goes on push's run_at timer: the claim takes the job when it
    comes due, not at the 30 s safety look."""
    b, push = served
    fut = await _parked(b, push)
    due = time.time() + 0.6
    job = b.job(run_at=due)
    await b.store.enqueue([job], now=None)
    res = await asyncio.wait_for(fut, 5)
    assert res.job is not None and res.job.job_id == job.job_id
    assert time.time() >= due


async def test_a_notify_lost_is_made_good_by_the_safety_look(served, monkeypatch):
    """A job entering waiting without its NOTIFY (the trigger off) is taken at the next
    safety look: one read by role and kind, whose credit wakes the claim."""
    b, push = served
    monkeypatch.setattr(hooks, "SAFETY_S", 0.5)
    await b.store.stop_wakeups()
    await b.store.start_wakeups()  # the keeper, now on the short interval
    fut = await _parked(b, push)
    async with b.store._conn() as conn:
        await conn.execute("ALTER TABLE jobs DISABLE TRIGGER wake_inserted")
        try:
            job = b.job()
            await b.store.enqueue([job], now=None)
        finally:
            await conn.execute("ALTER TABLE jobs ENABLE TRIGGER wake_inserted")
    res = await asyncio.wait_for(fut, 5)
    assert res.job is not None and res.job.job_id == job.job_id


async def test_a_job_of_another_role_wakes_no_parked_claim(served):
    """The NOTIFY names the role: a parked claim of role cpu does not look again for a job
    of role gpu (before: every NOTIFY woke every parked claim)."""
    b, push = served
    looks = 0

    async def attempt(_w: float) -> Any:
        nonlocal looks
        looks += 1
        return await b.store.claim("w", 30.0, b.policy)
    await b.store.heartbeat("w", ["cpu"], COOL)
    fut = asyncio.ensure_future(push.claim("w", None, 20.0, attempt))
    await asyncio.sleep(0.3)
    await b.store.heartbeat("w", ["cpu"], COOL)
    await asyncio.sleep(0.3)
    before = looks
    await b.store.enqueue([b.job(role="gpu")], now=None)
    await asyncio.sleep(0.5)
    assert looks == before and not fut.done()
    await b.store.enqueue([b.job(role="cpu")], now=None)
    res = await asyncio.wait_for(fut, 5)
    assert res.job is not None and looks == before + 1


async def test_a_limit_hold_freed_wakes_the_claim_a_limit_refused(served):
    """`l<limit>`: a lease holding a limit's unit ends, so the parked claim that the limit
    refused looks again at once (before: at the next poll)."""
    from coordd.rules.limits import LimitBook, LimitSpec
    from coordd.store.api import LeaseRef
    b, push = served
    b.policy = policy()
    b.policy.limits = LimitBook({"api": LimitSpec(concurrency=1)})
    await b.store.heartbeat("w", ["cpu"], COOL)
    await b.store.heartbeat("v", ["cpu"], COOL)
    first, second = b.job(limits=[("api", 1)]), b.job(limits=[("api", 1)])
    await b.store.enqueue([first, second], now=None)
    held = await b.store.claim("v", 30.0, b.policy)
    assert held.job is not None and held.job.job_id == first.job_id
    fut = asyncio.ensure_future(push.claim(
        "w", None, 20.0, lambda _w: b.store.claim("w", 30.0, b.policy)))
    await asyncio.sleep(0.5)
    assert not fut.done()
    await b.store.complete(LeaseRef(first.job_id, "v", held.lease.token), "1")
    res = await asyncio.wait_for(fut, 5)
    assert res.job is not None and res.job.job_id == second.job_id


async def test_an_idle_workers_heartbeat_is_one_statement(pg_dsn):
    """coordd.store.postgres.beats: a beat of a worker holding nothing is one round trip
    (before: BEGIN, five statements, COMMIT)."""
    from coordd.store.api_governance import Governance, WorkerBeat
    from coordd.store.postgres import PostgresStore
    from coordd import config as config_mod
    from coordd.service import governor
    st = PostgresStore(pg_dsn, pool_min=1, pool_max=1)
    await st.start()
    try:
        await st.truncate()
        cfg = config_mod.load(None)
        gov = Governance(policies=cfg.policies(), preemptor=governor.preemptor(cfg))
        beat = WorkerBeat(incarnation="i1", kinds_json=None, broken_json=None)
        await st.heartbeat_governed("w", ["cpu"], COOL, beat, gov)
        ran: list[str] = []
        async with st.pool.acquire() as conn:
            conn.add_query_logger(lambda q: ran.append(q.query))
        await st.heartbeat_governed("w", ["cpu"], COOL, beat, gov)
        assert len(ran) == 1, ran
    finally:
        await st.close()


async def test_a_resent_claim_id_is_one_round_trip_and_replays_on_both_paths(served):
    """coordd.store.postgres.claims: a fresh claim id costs no look-up (one statement);
    a resent one is refused by leases_claim_id and answered with the lease it granted,
    on the plain path and on the admission path (a fleet limit defined)."""
    from coordd.rules.limits import LimitBook, LimitSpec
    b, push = served
    await b.store.heartbeat("w", ["cpu"], COOL)
    await b.store.enqueue([b.job() for _ in range(4)], now=None)
    await b.store.claim("w", 30.0, b.policy)  # the gate decision remembered
    ran = []
    held = [await b.store.pool.acquire() for _ in range(b.store.pool.get_size())]
    for conn in held:  # each pool connection once
        conn.add_query_logger(lambda q: ran.append(q.query))
    for conn in held:
        await b.store.pool.release(conn)
    first = await b.store.claim("w", 30.0, b.policy, claim_id="c1")
    ran = [q for q in ran if "jit" not in q and "typeinfo" not in q]  # asyncpg's own
    assert first.job is not None and len(ran) == 1 and "INSERT INTO leases" in ran[0], ran
    again = await b.store.claim("w", 30.0, b.policy, claim_id="c1")
    assert again.job.job_id == first.job.job_id and again.lease.token == first.lease.token
    limited = policy()
    limited.limits = LimitBook({"api": LimitSpec(concurrency=10)})
    one = await b.store.claim("w", 30.0, limited, claim_id="c2")
    two = await b.store.claim("w", 30.0, limited, claim_id="c2")
    assert one.job is not None and two.job.job_id == one.job.job_id
