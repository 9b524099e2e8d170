"""PostgresStore under server-side failure: a backend terminated mid-statement, a
statement timeout, a lock held on the head row. The caller gets a typed, retryable
error (`unavailable`), never `internal` nor a hang, and nothing acknowledged is lost."""

from __future__ import annotations

import asyncio

import pytest

from coordd import errors
from coordd.store.api import LeaseRef
from tests.store.conftest import Bundle, open_store, policy

asyncpg = pytest.importorskip("asyncpg", reason="asyncpg is not installed")

SQL_LOCK_LEASE = "SELECT 1 FROM leases WHERE job_id = $1 FOR UPDATE"
SQL_LOCK_JOB = "SELECT 1 FROM jobs WHERE job_id = $1 FOR UPDATE"
SQL_WAITING_PID = ("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                   "AND pid <> pg_backend_pid()")


async def _pg(request, tmp_path, dsn_extra: str = "", **kw) -> Bundle:
    if dsn_extra:
        base = request.getfixturevalue("pg_dsn")
        from coordd.store.postgres import PostgresStore
        st = PostgresStore(base + dsn_extra, **kw)
        await st.start()
        await st.truncate()
    else:
        st = await open_store("postgres", request, tmp_path, **kw)
    return Bundle(store=st, kind="postgres", policy=policy())


async def _held(b: Bundle) -> tuple[str, LeaseRef]:
    await b.worker("w1", now=None)
    job_id = await b.enqueue(now=None)
    got = await b.store.claim("w1", 30.0, b.policy)
    return job_id, LeaseRef(job_id=job_id, worker_id="w1", token=got.lease.token)


async def _waiting_pid(admin) -> int:
    for _ in range(200):
        pid = await admin.fetchval(SQL_WAITING_PID)
        if pid is not None:
            return pid
        await asyncio.sleep(0.01)
    raise AssertionError("the store's statement never waited on the lock")


async def test_a_backend_terminated_mid_complete_is_unavailable_and_loses_nothing(
        request, tmp_path, pg_dsn):
    b = await _pg(request, tmp_path)
    admin = await asyncpg.connect(pg_dsn)
    try:
        job_id, ref = await _held(b)
        tx = admin.transaction()
        await tx.start()
        await admin.execute(SQL_LOCK_LEASE, job_id)  # the complete's DELETE waits on it
        done = asyncio.ensure_future(b.store.complete(ref, '{"ok": 1}'))
        pid = await _waiting_pid(admin)
        await admin.execute("SELECT pg_terminate_backend($1)", pid)
        with pytest.raises(errors.Unavailable):
            await asyncio.wait_for(done, 10)
        await tx.rollback()
        assert (await b.store.get_job(job_id)).status == "running"  # nothing half-written
        assert (await b.store.complete(ref, '{"ok": 1}')).status == "succeeded"  # the retry
    finally:
        await admin.close()
        await b.store.close()


async def test_a_statement_timeout_is_unavailable_not_internal(request, tmp_path, pg_dsn):
    b = await _pg(request, tmp_path, "&statement_timeout=200")
    admin = await asyncpg.connect(pg_dsn)
    try:
        job_id, ref = await _held(b)
        async with admin.transaction():
            await admin.execute(SQL_LOCK_LEASE, job_id)
            with pytest.raises(errors.Unavailable, match="statement timeout"):
                await asyncio.wait_for(b.store.renew(ref, 30.0), 10)
        assert (await b.store.renew(ref, 30.0)).lease_s == 30.0
    finally:
        await admin.close()
        await b.store.close()


async def test_a_deadlock_is_unavailable_not_internal(request, tmp_path, pg_dsn):
    """A transaction PostgreSQL rolls back (deadlock, serialization: class 40) stored
    nothing: the caller gets the retryable `unavailable`, not `internal`."""
    b = await _pg(request, tmp_path, "")
    admin = await asyncpg.connect(pg_dsn)
    try:
        first, second = await b.enqueue(), await b.enqueue()
        lock = "SELECT 1 FROM jobs WHERE job_id = $1 FOR UPDATE"
        both_hold = asyncio.Event()

        async def store_side() -> None:
            async with b.store._conn() as conn, conn.transaction():
                await conn.execute(lock, first)
                await both_hold.wait()
                await conn.execute(lock, second)

        await admin.execute("SET deadlock_timeout = '60s'")  # the store's side is the victim
        async with admin.transaction():
            await admin.execute(lock, second)
            task = asyncio.ensure_future(store_side())
            await asyncio.sleep(0.3)  # the store's session holds `first`
            both_hold.set()
            await admin.execute(lock, first)  # waits until the victim rolls back
        with pytest.raises(errors.Unavailable, match="deadlock detected.*retry"):
            await asyncio.wait_for(task, 10)
    finally:
        await admin.close()
        await b.store.close()


async def test_a_claim_skips_a_head_row_another_session_locks(request, tmp_path, pg_dsn):
    """SKIP LOCKED: a claim is not stuck behind a session holding FOR UPDATE on the head
    job; it takes the next one, and the head is still there once the lock goes."""
    b = await _pg(request, tmp_path)
    admin = await asyncpg.connect(pg_dsn)
    try:
        await b.worker("w1", now=None)
        head = await b.enqueue(now=None, priority=0)
        second = await b.enqueue(now=None, priority=1)
        async with admin.transaction():
            await admin.execute(SQL_LOCK_JOB, head)
            got = await asyncio.wait_for(b.claim("w1", None), 5)
            assert got.job.job_id == second
        assert (await b.claim("w1", None)).job.job_id == head
    finally:
        await admin.close()
        await b.store.close()


async def test_a_database_that_is_not_coordds_is_refused_clearly(pg_dsn):
    """A database with a `jobs` table of its own (no coordd schema version) is a
    StoreError naming the clash, not a raw DuplicateTableError; nothing of it changes."""
    from coordd.store.postgres import PostgresStore
    admin = await asyncpg.connect(pg_dsn)
    try:
        await admin.execute("DROP DATABASE IF EXISTS notcoordd")
        await admin.execute("CREATE DATABASE notcoordd")
        other_dsn = pg_dsn.replace("/postgres?", "/notcoordd?")
        other = await asyncpg.connect(other_dsn)
        try:
            await other.execute("CREATE TABLE jobs (id int PRIMARY KEY, name text)")
            st = PostgresStore(other_dsn)
            with pytest.raises(errors.StoreError, match="not a coordd database.*jobs"):
                await st.start()
            await st.close()
            assert await other.fetchval("SELECT to_regclass('coordd_schema_version')") is None
            assert await other.fetchval("SELECT to_regclass('workers')") is None
        finally:
            await other.close()
        await admin.execute("DROP DATABASE notcoordd")
    finally:
        await admin.close()


async def test_a_killed_listen_connection_is_replaced_and_the_gap_wakes(request, tmp_path,
                                                                        pg_dsn):
    """The LISTEN session terminated: the next wait listens again on a new session and
    returns True at once (NOTIFYs sent while nobody listened are gone, so claimers must
    look now rather than sleep a whole poll interval); later NOTIFYs wake it again."""
    b = await _pg(request, tmp_path)
    admin = await asyncpg.connect(pg_dsn)
    try:
        assert await b.store.wait_for_work(1.0) is False  # listening (the connect fits, loaded too)
        n = await admin.fetchval("SELECT count(pg_terminate_backend(pid)) FROM "
                                 "pg_stat_activity WHERE query LIKE 'LISTEN%'")
        assert n == 1
        await b.enqueue(now=None)  # nobody listens: this NOTIFY is lost
        for _ in range(100):  # asyncpg sees the session end
            if b.store._listener._conn.is_closed():
                break
            await asyncio.sleep(0.01)
        assert await asyncio.wait_for(b.store.wait_for_work(5.0), 2) is True
        waiter = asyncio.ensure_future(b.store.wait_for_work(5.0))
        await asyncio.sleep(0.05)
        await b.enqueue(now=None)
        assert await asyncio.wait_for(waiter, 2) is True
    finally:
        await admin.close()
        await b.store.close()


async def test_wait_for_work_with_the_server_gone_is_a_poll_not_a_raw_error(pg_dsn):
    from coordd.store.postgres import PostgresStore
    dead = PostgresStore(pg_dsn.replace("port=", "port=1"))  # nobody listens there
    assert await asyncio.wait_for(dead.wait_for_work(0.05), 2) is False
    await dead.close()


async def test_a_leader_whose_session_is_killed_is_told_at_once(request, tmp_path, pg_dsn):
    """The leadership session terminated under a held lock: `on_lost` fires promptly (the
    lock is gone; a standby takes it), and a lost bid or a clean exit never calls it."""
    b = await _pg(request, tmp_path)
    admin = await asyncpg.connect(pg_dsn)
    lost = asyncio.Event()
    try:
        async with b.store.leadership("coordd-lost", on_lost=lost.set) as won:
            assert won is True
            async with b.store.leadership("coordd-lost", on_lost=lost.set) as second:
                assert second is False
            assert not lost.is_set()
            n = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_locks "
                "WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()")
            assert n == 1
            await asyncio.wait_for(lost.wait(), 2)
            assert await admin.fetchval("SELECT pg_try_advisory_lock(hashtext('coordd-lost'))")
        clean = asyncio.Event()
        await admin.execute("SELECT pg_advisory_unlock_all()")
        async with b.store.leadership("coordd-lost", on_lost=clean.set) as won:
            assert won is True
        assert not clean.is_set()
    finally:
        await admin.close()
        await b.store.close()


class _DiesAfterCommit:
    """A pool connection whose claim statement runs (and commits) and whose reply is then
    lost, as when the connection drops between the server's commit and the reply."""

    def __init__(self, conn, statements: set[str], died: list[str]) -> None:
        self._conn, self._statements, self._died = conn, statements, died

    def __getattr__(self, name):
        return getattr(self._conn, name)

    async def _dies(self, method: str, query: str, *args, **kw):
        out = await getattr(self._conn, method)(query, *args, **kw)
        if query in self._statements and not self._died:
            self._died.append(query)
            raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle "
                                                      "of operation")
        return out

    async def fetch(self, query, *args, **kw):
        return await self._dies("fetch", query, *args, **kw)

    async def fetchrow(self, query, *args, **kw):
        return await self._dies("fetchrow", query, *args, **kw)


@pytest.mark.parametrize("path", ["first claim (full path)", "later claim (batched)"])
async def test_a_claim_committed_as_its_connection_dies_is_answered_by_its_claim_id(
        request, tmp_path, path):
    """The claim statement committed, then its reply was lost: the claim is answered with
    the lease it granted (looked up by claim_id on another connection), never left to
    the reaper, and the batcher does not run it again (no second job taken); without a
    claim_id the caller gets `unavailable`."""
    import contextlib

    from coordd.store.postgres import sql
    b = await _pg(request, tmp_path)
    try:
        await b.worker("w1", now=None)
        if path.startswith("later"):  # the worker's gate decision is remembered: batched
            first = await b.enqueue(now=None)
            got = await b.store.claim("w1", 30.0, b.policy, claim_id="c0")
            assert got.job.job_id == first
            await b.store.complete(LeaseRef(first, "w1", got.lease.token), '{"ok": 1}')
        mine, other = await b.enqueue(now=None), await b.enqueue(now=None)
        died: list[str] = []
        real = b.store.claims._conn

        @contextlib.asynccontextmanager
        async def dying():
            async with real() as conn:
                yield _DiesAfterCommit(conn, {sql.SQL_CLAIM, sql.SQL_CLAIM_BATCH}, died)
        b.store.claims._conn = dying
        got = await b.store.claim("w1", 30.0, b.policy, claim_id="c1")
        assert died, "the claim statement never ran on the dying connection"
        assert got.job.job_id == mine and got.lease.token >= 1
        b.store.claims._conn = real
        assert (await b.store.get_job(mine)).status == "running"
        assert (await b.store.get_job(other)).status == "waiting"  # not taken by a rerun
        assert (await b.store.status(30.0)).active_leases == 1
        assert (await b.store.complete(LeaseRef(mine, "w1", got.lease.token),
                                       '{"ok": 1}')).status == "succeeded"
        # no claim_id: nothing to look up, the caller hears `unavailable`
        died.clear()
        b.store.claims._conn = dying
        with pytest.raises(errors.Unavailable):
            await b.store.claim("w1", 30.0, b.policy)
    finally:
        await b.store.close()


async def test_a_pool_session_stuck_inside_a_transaction_loses_its_locks(request, tmp_path,
                                                                       pg_dsn):
    """coordd frozen (or cut off) between two statements of a transaction: with the
    daemon's pool settings the server ends that session after store_session_timeout_s,
    so the row locks it held do not outlive the fail-over (the standby's complete and
    reaper would wait on them for as long as the server's TCP keepalive takes: hours)."""
    from coordd.config import load
    from coordd.store.postgres.leader import pool_settings
    from coordd.daemon.server import Daemon
    cfg = load(None, store=pg_dsn, socket=str(tmp_path / "s.sock"),
               store_session_timeout_s=0.6)
    assert Daemon(cfg).coord.store.server_settings == pool_settings(0.6)
    b = await _pg(request, tmp_path, server_settings=pool_settings(0.6))
    admin = await asyncpg.connect(pg_dsn)
    locked = asyncio.Event()

    async def frozen_between_statements(job_id: str) -> None:
        async with b.store._conn() as conn:
            tx = conn.transaction()
            await tx.start()
            await conn.execute(SQL_LOCK_JOB, job_id)
            locked.set()
            await asyncio.Event().wait()
    try:
        job_id, _ref = await _held(b)
        stuck = asyncio.ensure_future(frozen_between_statements(job_id))
        await asyncio.wait_for(locked.wait(), 5)
        free = False
        for _ in range(60):
            try:
                async with admin.transaction():
                    await admin.execute(SQL_LOCK_JOB + " NOWAIT", job_id)
                free = True
                break
            except asyncpg.LockNotAvailableError:
                await asyncio.sleep(0.05)
        assert free, "the stuck session still holds the job's row lock after 3 s"
        stuck.cancel()
        await asyncio.gather(stuck, return_exceptions=True)
        assert (await b.store.get_job(job_id)).status == "running"  # nothing half-written
    finally:
        await admin.close()
        await b.store.close()


async def test_a_connection_asyncpg_lost_track_of_is_unavailable_and_leaves_the_pool(
        request, tmp_path):
    """A backend terminated under asyncpg can leave the connection's protocol in a state
    asyncpg refuses to go on from (InternalClientError "cannot switch to state 12; another
    operation (2) is in progress", seen under pg_terminate_backend with 12 clients): the
    caller gets `unavailable` (it may have been stored), never `internal`, and that
    connection is not handed out again."""
    b = await _pg(request, tmp_path, pool_min=1, pool_max=1)
    try:
        with pytest.raises(errors.Unavailable):
            async with b.store._conn() as conn:
                lost = conn._con
                raise asyncpg.InternalClientError(
                    "cannot switch to state 12; another operation (2) is in progress")
        assert lost.is_closed()
        async with b.store._conn() as conn:
            assert await conn.fetchval("SELECT 1") == 1
    finally:
        await b.store.close()


async def test_a_release_that_fails_after_the_work_does_not_turn_it_into_an_error(
        request, tmp_path, monkeypatch):
    """The pool's reset of a connection whose backend was terminated right after the
    statement committed raises from `release`: the statement stands (it is not reported
    as failed, which would make a stored report look refused), and the connection is
    dropped by the pool."""
    b = await _pg(request, tmp_path)
    try:
        job_id, ref = await _held(b)
        real = asyncpg.pool.Pool.release

        async def failing(pool, conn, *a, **kw):
            monkeypatch.setattr(asyncpg.pool.Pool, "release", real)  # once
            conn._con.terminate()
            await real(pool, conn, *a, **kw)
            raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle "
                                                      "of operation")
        monkeypatch.setattr(asyncpg.pool.Pool, "release", failing)
        res = await b.store.complete(ref, '{"ok": 1}')
        assert res.status == "succeeded"
        assert (await b.store.get_job(job_id)).status == "succeeded"
    finally:
        await b.store.close()
