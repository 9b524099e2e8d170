"""PostgreSQL's complete with its next claim as ONE statement (coordd.store.postgres.eager,
eager_sql): concurrent workers over real pool connections, and the cases the statement
leaves to the transaction path. The rules themselves are the driver suite's
(tests/store/test_conformance_eager.py, both stores)."""

from __future__ import annotations

import asyncio

import pytest

from coordd import errors
from coordd.rules import gates
from coordd.rules.claim_batch import NextClaim
from coordd.store.api import LeaseRef
from tests.store.conftest import COOL, Bundle, open_store, policy

asyncpg = pytest.importorskip("asyncpg", reason="asyncpg is not installed")


def _next(b: Bundle, worker: str, claim_id: str | None = None) -> NextClaim:
    return NextClaim(worker_id=worker, lease_s=60.0, policy=b.policy, kinds=None,
                     claim_id=claim_id, max_jobs=1)


async def _beat(b: Bundle, worker: str, **readings: object) -> None:
    await b.store.heartbeat(worker, ["cpu"], {**COOL, **readings})  # the database's clock


async def _count(b: Bundle, sql: str) -> int:
    async with b.store.pool.acquire() as conn:
        return int(await conn.fetchval(sql))


async def test_16_workers_drain_by_completes_with_next_each_job_once(pg):
    """16 workers (half of them with two roles) claim once, then only complete with
    `next`: every job is handed out once, succeeds once with one event per transition,
    the counts hold, and the completes ran as single statements (batched)."""
    jobs = 2000
    for start in range(0, jobs, 1000):
        await pg.store.enqueue([pg.job(priority=n % 4) for n in range(start, start + 1000)])
    taken: list[str] = []

    async def worker(n: int) -> None:
        w = f"w{n}"
        await pg.store.heartbeat(w, ["cpu"] if n % 2 else ["cpu", "gpu"], COOL)
        got = await pg.store.claim(w, 60.0, pg.policy)
        k = 0
        while got.job is not None:
            taken.append(got.job.job_id)
            k += 1
            res = await pg.store.complete(LeaseRef(got.job.job_id, w, got.lease.token), "1",
                                          then=_next(pg, w, f"{w}-{k}"))
            assert res.status == "succeeded" and res.next is not None
            got = res.next
        assert got.reasons == []  # nothing runnable is left: no refusal

    await asyncio.gather(*(worker(n) for n in range(16)))
    assert len(taken) == jobs and len(set(taken)) == jobs  # 0 double claims
    st = await pg.store.status(30.0)
    assert st.jobs["succeeded"] == jobs and st.jobs["waiting"] == 0 and st.active_leases == 0
    for to_status in ("running", "succeeded"):
        assert await _count(pg, "SELECT count(*) FROM (SELECT job_id FROM job_events WHERE "
                                f"to_status = '{to_status}' GROUP BY job_id "
                                "HAVING count(*) = 1) x") == jobs
    paths = pg.store.eager_paths
    assert paths["statement"] >= jobs - 16 and paths["transaction"] <= 16
    assert pg.store.completes_next.statements < pg.store.completes_next.items  # batched


async def test_a_decision_that_no_longer_stands_takes_the_transaction_path(pg):
    """A heartbeat after the claim (the gate decision is stale): the statement stores
    nothing, and the report is run in a transaction under the new decision."""
    p3 = [await pg.enqueue(priority=3) for _ in range(2)]
    await _beat(pg, "w1")
    got = await pg.store.claim("w1", 60.0, pg.policy)
    assert got.job.job_id == p3[0]
    await _beat(pg, "w1", on_battery=True)  # P3 idle work refused on battery
    res = await pg.store.complete(LeaseRef(p3[0], "w1", got.lease.token), "1",
                                  then=_next(pg, "w1"))
    assert res.status == "succeeded" and res.next.job is None
    assert gates.ON_BATTERY in res.next.reasons
    assert pg.store.eager_paths == {"statement": 0, "transaction": 1}
    p2 = await pg.enqueue(priority=2)
    await _beat(pg, "w1", on_battery=True)
    got = await pg.store.claim("w1", 60.0, pg.policy)
    assert got.job.job_id == p2
    res = await pg.store.complete(LeaseRef(p2, "w1", got.lease.token), "1",
                                  then=_next(pg, "w1"))
    assert res.next.job is None and gates.ON_BATTERY in res.next.reasons  # no job: why
    assert pg.store.eager_paths == {"statement": 1, "transaction": 1}


async def test_a_refused_complete_claims_nothing_and_says_why(pg):
    """A stale token and a resent complete: the statement stores nothing, nothing is
    claimed, and the fence's error comes back (no transaction needed)."""
    a, b = await pg.enqueue(), await pg.enqueue()
    await _beat(pg, "w1")
    got = await pg.store.claim("w1", 60.0, pg.policy)
    with pytest.raises(errors.LeaseLost):
        await pg.store.complete(LeaseRef(a, "w1", got.lease.token + 1), "1",
                                then=_next(pg, "w1"))
    res = await pg.store.complete(LeaseRef(a, "w1", got.lease.token), "1",
                                  then=_next(pg, "w1"))
    assert res.next.job.job_id == b
    with pytest.raises(errors.AlreadyCompleted):
        await pg.store.complete(LeaseRef(a, "w1", got.lease.token), "1", then=_next(pg, "w1"))
    assert (await pg.store.get_job(b)).lease.token == res.next.lease.token
    assert pg.store.eager_paths == {"statement": 3, "transaction": 0}


async def test_a_complete_that_meets_a_cancel_ends_cancelled_and_still_claims(pg):
    a, b = await pg.enqueue(), await pg.enqueue()
    await _beat(pg, "w1")
    got = await pg.store.claim("w1", 60.0, pg.policy)
    await pg.store.cancel(a)
    res = await pg.store.complete(LeaseRef(a, "w1", got.lease.token), '{"x": 1}',
                                  then=_next(pg, "w1"))
    assert res.status == "cancelled" and res.next.job.job_id == b
    view = await pg.store.get_job(a)
    assert view.status == "cancelled" and view.result is None
    assert pg.store.eager_paths["statement"] == 1


async def test_repeated_claim_ids_in_one_statement_answer_their_leases(request, tmp_path):
    """Three workers' completes batched into statements (one in flight at a time): a
    claim id that holds a live lease answers that lease, in the one-worker and in the
    several-worker statement alike; no job is taken twice."""
    st = await open_store("postgres", request, tmp_path, batch_in_flight=1)
    b = Bundle(store=st, kind="postgres", policy=policy())
    try:
        workers = ["w1", "w2", "w3"]
        for w in workers:
            await _beat(b, w)
        held = {}
        for w in workers:
            jobs = [await b.enqueue() for _ in range(2)]
            held[w] = [await st.claim(w, 60.0, b.policy) for _ in jobs]
        spare = [await b.enqueue(priority=3) for _ in workers]

        async def complete(w: str, k: int) -> object:
            got = held[w][k]
            return await st.complete(LeaseRef(got.job.job_id, w, got.lease.token), "1",
                                     then=_next(b, w, f"{w}-n"))
        first = await asyncio.gather(*(complete(w, 0) for w in workers))
        again = await asyncio.gather(*(complete(w, 1) for w in workers))
        assert [r.status for r in again] == ["succeeded"] * 3
        assert [(r.next.job.job_id, r.next.lease.token) for r in again] == \
            [(r.next.job.job_id, r.next.lease.token) for r in first]
        assert sorted(r.next.job.job_id for r in first) == sorted(spare)
        assert st.completes_next.statements < st.completes_next.items  # batched
        assert st.eager_paths == {"statement": 6, "transaction": 0}
    finally:
        await st.close()


async def test_a_next_job_that_does_not_decode_is_dead_lettered(pg):
    """The statement took a job whose stored payload is not JSON: the job ends failed,
    the report stands, and `next` is left to the Coordinator (None)."""
    a = await pg.enqueue()
    await _beat(pg, "w1")
    got = await pg.store.claim("w1", 60.0, pg.policy)
    bad = await pg.enqueue(priority=0, payload_json="{not json")
    res = await pg.store.complete(LeaseRef(a, "w1", got.lease.token), "1",
                                  then=_next(pg, "w1"))
    assert res.status == "succeeded" and res.next is None
    view = await pg.store.get_job(bad)
    assert view.status == "failed" and view.lease is None
    assert gates.PAYLOAD_DECODE_ERROR in (view.last_error or "")


async def test_the_hot_statements_keep_a_generic_plan(request, tmp_path):
    """The plain complete and the complete with its next claim are planned once per
    session, not at every call (pg_prepared_statements on the pool's one connection)."""
    from coordd.store.postgres import eager_sql, sql
    st = await open_store("postgres", request, tmp_path, pool_min=1, pool_max=1)
    b = Bundle(store=st, kind="postgres", policy=policy())
    try:
        await _beat(b, "w1")
        for _ in range(20):
            await b.enqueue()
        for _ in range(8):
            got = await st.claim("w1", 60.0, b.policy)
            await st.complete(LeaseRef(got.job.job_id, "w1", got.lease.token), "1")
        got = await st.claim("w1", 60.0, b.policy)
        for _ in range(8):
            got = (await st.complete(LeaseRef(got.job.job_id, "w1", got.lease.token), "1",
                                     then=_next(b, "w1"))).next
        async with st.pool.acquire() as conn:
            plans = {r[0]: (r[1], r[2]) for r in await conn.fetch(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")}
        for text in (sql.SQL_COMPLETE_BATCH, eager_sql.SQL_COMPLETE_NEXT):
            generic, custom = plans[text]
            assert generic >= 3 and custom <= 5  # custom: the plan cache's first five
    finally:
        await st.close()


@pytest.mark.parametrize("path", ["statement", "transaction"])
@pytest.mark.parametrize("zombie_first", [True, False])
async def test_a_stale_holders_complete_in_the_same_statement_never_writes_its_result(
        request, tmp_path, path, zombie_first):
    """Two workers report the same job in one batched statement: the one whose lease
    expired (a stale token) and the one that claimed it after the reaper. The holder's
    result is stored, the stale one gets lease_lost, and the stale one claims nothing.
    (The completes with `next` are batched per worker, not per job: a join on the job
    alone picked either worker's result.)"""
    st = await open_store("postgres", request, tmp_path, eager_in_flight=1)
    pol = policy() if path == "statement" else policy(aging_interval_s=60.0)
    b = Bundle(store=st, kind="postgres", policy=pol)
    try:
        x = await b.enqueue(priority=0)
        filler = await b.enqueue(priority=1)
        spare = [await b.enqueue(priority=3) for _ in range(3)]
        for w in ("zombie", "holder", "filler"):
            await _beat(b, w)
        old = await st.claim("zombie", 60.0, b.policy)
        assert old.job.job_id == x
        async with st.pool.acquire() as conn:
            await conn.execute("UPDATE leases SET expires_at = extract(epoch FROM now()) - 1 "
                               "WHERE job_id = $1", x)
        assert await st.reap() == 1
        new = await st.claim("holder", 60.0, b.policy)
        assert new.job.job_id == x and new.lease.token > old.lease.token
        held = await st.claim("filler", 60.0, b.policy)
        assert held.job.job_id == filler

        async def complete(w: str, got: object, result: str) -> object:
            try:
                return await st.complete(LeaseRef(x if w != "filler" else filler, w,
                                                  got.lease.token), result,
                                         then=_next(b, w, f"{w}-n"))
            except errors.CoordError as exc:
                return exc
        pair = [("zombie", old, '"zombie"'), ("holder", new, '"holder"')]
        if not zombie_first:
            pair.reverse()
        got = await asyncio.gather(complete("filler", held, '"f"'),
                                   *(complete(*p) for p in pair))
        by = dict(zip(["filler"] + [p[0] for p in pair], got))
        assert st.completes_next.statements == 2  # the filler alone, then the pair
        assert isinstance(by["zombie"], errors.LeaseLost)
        assert by["holder"].status == "succeeded"
        view = await st.get_job(x)
        assert view.status == "succeeded" and view.result == "holder"
        assert sorted([by["holder"].next.job.job_id, by["filler"].next.job.job_id]) == \
            sorted(spare[:2])
    finally:
        await st.close()
