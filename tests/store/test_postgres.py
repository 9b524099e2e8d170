"""PostgreSQL-only rules: concurrent claimers over real pool connections, the database's
clock, migrations under the advisory lock, batching, LISTEN wake-ups, leadership."""

from __future__ import annotations

import asyncio

import pytest

from coordd import errors
from coordd.store.api import LeaseRef
from tests.store.conftest import Bundle, open_store, policy

asyncpg = pytest.importorskip("asyncpg", reason="asyncpg is not installed")


async def _drain(b: Bundle, jobs: int, claimers: int) -> None:
    """`claimers` tasks claim and complete until the queue is empty; then check that no
    job was handed out twice and every job succeeded exactly once."""
    for start in range(0, jobs, 1000):
        await b.store.enqueue([b.job() for _ in range(min(1000, jobs - start))])
    taken: list[str] = []

    async def claimer(n: int) -> None:
        worker = f"w{n}"
        await b.store.heartbeat(worker, ["cpu"], {"memory_used_pct": 10.0})
        while True:
            got = await b.store.claim(worker, 60.0, b.policy)
            if got.job is None:
                return
            taken.append(got.job.job_id)
            await b.store.complete(LeaseRef(got.job.job_id, worker, got.lease.token), "1")
    await asyncio.gather(*(claimer(n) for n in range(claimers)))
    assert len(taken) == jobs and len(set(taken)) == jobs  # 0 double claims
    st = await b.store.status(30.0)
    assert st.jobs["succeeded"] == jobs and st.active_leases == 0
    async with b.store.pool.acquire() as conn:  # every job ran, and ended, exactly once
        assert await conn.fetchval(
            "SELECT count(*) FROM (SELECT job_id FROM job_events WHERE to_status = 'succeeded' "
            "GROUP BY job_id HAVING count(*) = 1) x") == jobs


async def test_16_claimers_no_double_claims(pg):
    await _drain(pg, 3000, 16)
    # claims and completes from 16 claimers shared statements (per-operation batching)
    assert pg.store.completes.statements < pg.store.completes.items
    assert pg.store.claims.batcher.statements < pg.store.claims.batcher.items


@pytest.mark.slow
async def test_16_claimers_20000_jobs(pg):
    await _drain(pg, 20_000, 16)


async def test_times_come_from_the_database_clock(pg):
    """now=None: the statement's own now() (not Python's clock) stamps and decides."""
    async with pg.store.pool.acquire() as conn:
        db_now = await conn.fetchval("SELECT extract(epoch FROM now())::float8")
    await pg.store.enqueue([pg.job()])
    hb = await pg.store.heartbeat("a", ["cpu"], {"memory_used_pct": 1.0})
    got = await pg.store.claim("a", 5.0, pg.policy)
    assert abs(hb.now - db_now) < 60 and got.lease.expires_at - hb.now == pytest.approx(5, abs=2)
    view = await pg.store.get_job(got.job.job_id)
    assert view.lease.expires_at - view.lease.granted_at == 5.0
    # a pinned now far ahead expires the lease whatever Python's clock says
    with pytest.raises(errors.LeaseExpired):
        await pg.store.renew(LeaseRef(got.job.job_id, "a", 1), 5.0, now=hb.now + 3600)


async def test_migrations_run_once_under_the_advisory_lock(pg):
    from coordd.store.postgres import schema
    conns = [await asyncpg.connect(pg.store.dsn) for _ in range(4)]
    try:
        got = await asyncio.gather(*(schema.migrate(c) for c in conns))
        assert got == [schema.SCHEMA_VERSION] * 4
        assert await conns[0].fetchval("SELECT count(*) FROM coordd_schema_version") \
            == schema.SCHEMA_VERSION
        with pytest.raises(errors.StoreError):
            await schema.migrate(conns[0], target=0)  # the database is newer
    finally:
        for c in conns:
            await c.close()


async def test_batched_renews_keep_each_callers_answer(pg):
    """Renews batched into one statement: each caller gets its own result or error."""
    await pg.store.enqueue([pg.job() for _ in range(8)], now=100.0)
    await pg.store.heartbeat("a", ["cpu"], {}, now=100.0)
    got = [await pg.store.claim("a", 30.0, pg.policy, now=100.0) for _ in range(8)]
    refs = [LeaseRef(g.job.job_id, "a", g.lease.token) for g in got]
    refs[3] = LeaseRef(refs[3].job_id, "a", 99)  # a stale token among them
    before = pg.store.renews.statements
    res = await asyncio.gather(*(pg.store.renew(r, 40.0, now=110.0) for r in refs),
                               return_exceptions=True)
    assert isinstance(res[3], errors.LeaseLost)
    assert all(r.expires_at == 150.0 for i, r in enumerate(res) if i != 3)
    assert pg.store.renews.statements - before < len(refs)


async def test_wait_for_work_wakes_on_notify(pg):
    assert await pg.store.wait_for_work(0.01) is False  # nothing: the poll backstop
    waiter = asyncio.ensure_future(pg.store.wait_for_work(30.0))  # listening since above
    await pg.store.enqueue([pg.job()])
    assert await asyncio.wait_for(waiter, 10.0) is True
    assert await pg.store.wait_for_work(0.01) is False  # the hint was taken


async def test_leadership_is_one_session_at_a_time(pg):
    async with pg.store.leadership("coordd-test") as first:
        assert first is True
        async with pg.store.leadership("coordd-test") as second:
            assert second is False
    async with pg.store.leadership("coordd-test") as after:
        assert after is True  # the leader's session ended: the lock went with it


LEADER = """
import asyncio, sys
from coordd.store.postgres import coordination
async def main():
    async with coordination.leadership(sys.argv[1], "coordd-kill") as won:
        print("won" if won else "lost", flush=True)
        await asyncio.sleep(3600)
asyncio.run(main())
"""


async def test_a_sigkilled_leaders_lock_goes_with_its_session(pg):
    """A leader process killed with SIGKILL: its session ends, and another takes over."""
    import signal
    import sys
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", LEADER, pg.store.dsn,
                                                stdout=asyncio.subprocess.PIPE)
    try:
        assert (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() == b"won"
        async with pg.store.leadership("coordd-kill") as won:
            assert won is False
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        for _ in range(200):  # the server ends the session once it reads the EOF
            async with pg.store.leadership("coordd-kill") as won:
                if won:
                    break
            await asyncio.sleep(0.025)
        assert won is True
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_an_unreachable_server_is_unavailable(pg, pg_dsn):
    """A connection that cannot be made is `unavailable` (retryable), typed."""
    from coordd.store.postgres import PostgresStore
    dead = PostgresStore(pg_dsn.replace("port=", "port=1"))  # nobody listens there
    with pytest.raises(errors.Unavailable):
        await dead.start()


async def test_transactional_enqueue_commits_with_the_callers_rows(pg):
    """The job exists iff the caller's transaction commits (issue 20, item 4)."""
    from coordd.store.postgres import enqueue_tx
    async with pg.store.pool.acquire() as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS app_orders (id int PRIMARY KEY)")
        await conn.execute("TRUNCATE app_orders")
        with pytest.raises(errors.BadRequest, match="transaction"):
            await enqueue_tx.enqueue(conn, kind="k", required_role="cpu")
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await conn.execute("INSERT INTO app_orders VALUES (1)")
                lost, _ = await enqueue_tx.enqueue(conn, kind="k", required_role="cpu")
                raise RuntimeError("the application's transaction fails")
        async with conn.transaction():
            await conn.execute("INSERT INTO app_orders VALUES (2)")
            kept, created = await enqueue_tx.enqueue(
                conn, kind="k", required_role="cpu", payload={"order": 2}, priority=1,
                idempotency_key="order-2")
        async with conn.transaction():
            again, created_again = await enqueue_tx.enqueue(
                conn, kind="k", required_role="cpu", payload={"order": 2}, priority=1,
                idempotency_key="order-2")
            with pytest.raises(errors.InvalidState):
                await enqueue_tx.enqueue(conn, kind="k", required_role="cpu",
                                         payload={"order": 3}, idempotency_key="order-2")
    assert created and not created_again and again == kept
    with pytest.raises(errors.NotFound):
        await pg.store.get_job(lost)
    await pg.store.heartbeat("a", ["cpu"], {"memory_used_pct": 1.0})
    got = await pg.store.claim("a", 30.0, pg.policy)
    assert got.job.job_id == kept and got.job.payload == {"order": 2}


async def test_a_bad_item_fails_alone_in_a_batch(request, tmp_path):
    """Only the caller whose claim id collides is refused (typed), the others are served,
    whichever statements their claims share (tests/store/test_batch.py: the rerun)."""
    st = await open_store("postgres", request, tmp_path, batch_in_flight=1)
    b = Bundle(store=st, kind="postgres", policy=policy())
    try:
        # 7: a job is left for a's claim whichever order the batch serves the three in
        await st.enqueue([b.job() for _ in range(7)], now=100.0)
        for w in ("a", "b", "c"):
            await st.heartbeat(w, ["cpu"], {}, now=100.0)
            await st.claim(w, 30.0, b.policy, now=100.0)  # decisions remembered
        await st.claim("a", 5.0, b.policy, claim_id="dup", now=100.0)
        # a's lease "dup" expired unreaped: a second lease with that id cannot be stored
        res = await asyncio.gather(*(st.claim(w, 30.0, b.policy, claim_id=c, now=110.0)
                                     for w, c in (("b", "x"), ("a", "dup"), ("c", "y"))),
                                   return_exceptions=True)
        assert res[0].job is not None and res[2].job is not None
        assert isinstance(res[1], errors.BadRequest)
    finally:
        await st.close()


async def test_a_value_postgresql_cannot_store_is_bad_request(pg):
    """A raw NUL in stored JSON text is refused by PostgreSQL: bad_request, the lease still
    held. (Free text, a worker's error, is stored with U+FFFD: test_conformance.)"""
    await pg.store.enqueue([pg.job()], now=100.0)
    await pg.store.heartbeat("a", ["cpu"], {}, now=100.0)
    got = await pg.store.claim("a", 30.0, pg.policy, now=100.0)
    r = LeaseRef(got.job.job_id, "a", got.lease.token)
    with pytest.raises(errors.BadRequest):
        await pg.store.checkpoint(r, '"nul \x00 inside"', now=101.0)
    assert (await pg.store.renew(r, 30.0, now=102.0)).expires_at == 132.0


DRAINER = """
import asyncio, sys
from coordd import config
from coordd.rules.claim_policy import ClaimPolicy
from coordd.store.api import LeaseRef
from coordd.store.postgres import PostgresStore
async def main():
    cfg = config.load(None)
    pol = ClaimPolicy(policies=cfg.policies(), heartbeat_stale_s=3600,
                      aging_interval_s=0.0)
    st = PostgresStore(sys.argv[1], pool_max=10)
    await st.start()
    async def one(n):
        w = f"k{n}"
        await st.heartbeat(w, ["cpu"], {})
        while True:
            got = await st.claim(w, 60.0, pol)
            if got.job is None:
                return
            await st.complete(LeaseRef(got.job.job_id, w, got.lease.token), '"ok"')
            print(got.job.job_id, flush=True)  # acknowledged
    await asyncio.gather(*(one(n) for n in range(8)))
asyncio.run(main())
"""


async def test_sigkill_under_load_loses_no_acknowledged_complete(pg):
    """The store's process SIGKILLed mid-drain: every complete it was answered for is
    stored; the leases it held are reaped later and their jobs run again."""
    import signal
    import sys
    await pg.store.enqueue([pg.job() for _ in range(3000)])
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", DRAINER, pg.store.dsn,
                                                stdout=asyncio.subprocess.PIPE)
    acked: list[str] = []
    try:
        while len(acked) < 300:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line, "the drainer ended early"
            acked.append(line.decode().strip())
        proc.send_signal(signal.SIGKILL)
        acked += [x.decode().strip() for x in (await proc.stdout.read()).splitlines() if x]
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    for job_id in acked:
        assert (await pg.store.get_job(job_id)).status == "succeeded"
    st = await pg.store.status(3600.0)
    assert st.jobs["succeeded"] >= len(acked) and st.active_leases <= 8
    later = (await pg.store.heartbeat("x", [], {})).now + 120  # past its 60 s leases
    assert await pg.store.reap(now=later) == st.active_leases
    assert (await pg.store.status(3600.0)).jobs["waiting"] == 3000 - st.jobs["succeeded"]


async def test_a_full_pool_is_overloaded_not_a_hang(request, tmp_path):
    st = await open_store("postgres", request, tmp_path, pool_min=1, pool_max=1,
                          acquire_timeout_s=0.2)
    try:
        held = await st.pool.acquire()  # the one connection, busy
        try:
            with pytest.raises(errors.Overloaded, match="no PostgreSQL connection free"):
                await st.status(30.0)
        finally:
            await st.pool.release(held)
        assert (await st.status(30.0)).workers == 0  # served again once one is free
    finally:
        await st.close()


async def test_push_notifies_only_what_a_parked_call_wants(pg):
    """coordd.store.postgres.push_sql: a job ending and new events NOTIFY only while a
    parked call wants them (claims and completes send nothing otherwise); a cancel of a
    held job always names its holder."""
    heard: list[str] = []
    conn = await asyncpg.connect(pg.store.dsn)
    await conn.add_listener("coordd_push", lambda *a: heard.append(a[3]))
    try:
        async def run_one() -> str:
            job_id = await pg.enqueue()
            got = await pg.store.claim("w1", 60.0, pg.policy)
            await pg.store.complete(LeaseRef(got.job.job_id, "w1", got.lease.token), "1")
            await asyncio.sleep(0.2)  # a NOTIFY arrives after its commit
            return job_id

        await pg.worker("w1", now=None)
        await run_one()
        assert heard == []
        await pg.store.want_wakeups("t", 10.0)
        await pg.store.want_wakeups("e", 10.0)
        ended = await run_one()
        assert f"t{ended}" in heard and "e" in heard, heard
        heard.clear()
        held = await pg.enqueue()
        got = await pg.store.claim("w1", 60.0, pg.policy)
        assert got.job.job_id == held
        await pg.store.cancel(held)
        await asyncio.sleep(0.2)
        assert "cw1" in heard, heard
    finally:
        await conn.close()
