"""Claims by role over both stores: a worker's claim takes its roles' best job however many
jobs of other roles wait ahead, and a worker of several roles takes them in claim order
across its roles; on PostgreSQL the claim walks the role-led index (jobs_claim_role) and
never steps over the other roles' waiting jobs."""

from __future__ import annotations

import asyncio

import pytest

from tests.store.conftest import T0

OTHERS = 300  # waiting jobs of a role nobody here takes, queued before the rest


async def crowd(b) -> None:
    """OTHERS gpu jobs, queued first (the front of every priority's queue)."""
    await b.store.enqueue([b.job(role="gpu", priority=p % 4) for p in range(OTHERS)],
                          now=T0 - 100)


async def test_a_claim_takes_its_roles_jobs_past_other_roles_waiting_ahead(bundle):
    b = bundle
    await crowd(b)
    io_old = await b.enqueue(now=T0, role="io")
    cpu_p1 = await b.enqueue(now=T0 + 1, priority=1)
    cpu = await b.enqueue(now=T0 + 2)
    io_new = await b.enqueue(now=T0 + 3, role="io")
    await b.worker("one", now=T0 + 5)
    await b.worker("two", now=T0 + 5, roles=["io", "cpu"])
    got = await b.claim("one", now=T0 + 5)
    assert got.job.job_id == cpu_p1
    taken = [(await b.claim("two", now=T0 + 5)).job.job_id for _ in range(3)]
    assert taken == [io_old, cpu, io_new]  # priority, then queued_at, across both roles
    none = await b.claim("two", now=T0 + 5)
    assert none.job is None
    st = await b.store.status(30.0, now=T0 + 5)
    assert st.jobs["waiting"] == OTHERS and st.jobs["running"] == 4


@pytest.mark.parametrize("roles", [["cpu"], ["cpu", "io"]])
async def test_claims_at_once_share_out_every_job_once(bundle, roles):
    """Concurrent claims (one statement for those whose decision is remembered) take each
    job once. With one role they take the best jobs (both stores); with several, on
    PostgreSQL, a claim also locks each other role's best for the statement's length, so
    a claim at the same instant may take the next one instead (coordd's decisions.md)."""
    b = bundle
    await crowd(b)
    want = [await b.enqueue(now=T0 + i, role=roles[i % len(roles)]) for i in range(6)]
    workers = [f"w{i}" for i in range(4)]
    for w in workers:
        await b.worker(w, now=T0 + 10, roles=roles)
    taken: list[str] = []
    for _ in range(3):  # later rounds find the decisions remembered
        got = await asyncio.gather(*(b.claim(w, now=T0 + 10) for w in workers))
        ids = [g.job.job_id for g in got if g.job is not None]
        if len(roles) == 1 or b.kind == "sqlite":
            assert sorted(ids) == sorted(want[len(taken):len(taken) + len(ids)])
        taken += ids
    assert sorted(taken) == sorted(want)


async def test_postgres_claim_walks_the_role_led_index(bundle):
    b = bundle
    if b.kind != "postgres":
        pytest.skip("SQLite's claim walks per (role, kind) level: coordd.store.claim_index")
    from coordd.store.postgres import sql
    await crowd(b)
    await b.worker("w", now=T0)
    async with b.store._conn() as conn:
        await conn.execute("ANALYZE jobs")
        for roles in (["cpu"], ["cpu", "io"]):
            stmt = await conn.prepare("EXPLAIN (ANALYZE, COSTS OFF) " + sql.claim_sql(roles))
            for _ in range(7):  # past the custom plans: the generic one too
                async with conn.transaction():
                    plan = "\n".join(r[0] for r in await stmt.fetch(
                        T0, "w", 30.0, None, [0, 1, 2, 3], roles, None, 30.0, None, None,
                        None))
                assert "jobs_claim_role" in plan and "Rows Removed by Filter" not in plan, plan
