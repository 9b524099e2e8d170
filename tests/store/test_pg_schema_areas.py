"""PostgreSQL only: a database made by a coordd before the hub, job logs and enrolment
tokens gains their tables on upgrade, its jobs untouched."""

from __future__ import annotations

import uuid

import pytest

asyncpg = pytest.importorskip("asyncpg", reason="asyncpg is not installed")

# 30 jobs j1..j30, priority g % 4, every third succeeded and the rest waiting
SQL_THIRTY_JOBS = (
    "INSERT INTO jobs (job_id, kind, required_role, priority, payload_json, status, "
    "max_attempts, run_at, queued_at, created_at, updated_at) SELECT 'j' || g, 'k', 'cpu', "
    "g % 4, '{}', CASE WHEN g % 3 = 0 THEN 'succeeded' ELSE 'waiting' END, 3, 1, 1, 1, 1 "
    "FROM generate_series(1, 30) g"
)


async def test_an_older_database_gains_the_hub_logs_and_enrol_tables(pg_dsn):
    from coordd.store.postgres import schema
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_dsn)
    await admin.execute(f"CREATE DATABASE {name}")
    conn = await asyncpg.connect(pg_dsn.replace("/postgres?", f"/{name}?"))
    try:
        first = min(schema.MIGRATIONS.index(m) for m in (
            schema.MIGRATION_HUB, schema.MIGRATION_LOGS, schema.MIGRATION_ENROL))
        await schema.migrate(conn, target=first)  # the coordd before these areas
        await conn.execute("INSERT INTO jobs (job_id, kind, required_role, priority, "
                           "payload_json, status, max_attempts, run_at, queued_at, "
                           "created_at, updated_at) VALUES ('j1', 'k', 'cpu', 2, '{}', "
                           "'waiting', 3, 1, 1, 1, 1)")
        assert await conn.fetchval("SELECT to_regclass('messages')") is None
        assert await schema.migrate(conn) == schema.SCHEMA_VERSION
        for table in ("messages", "message_reads", "agents", "job_logs", "enrol_tokens",
                      "workflows", "workflow_edges"):
            assert await conn.fetchval("SELECT to_regclass($1)::text", table) == table
        assert await conn.fetchval("SELECT status FROM jobs WHERE job_id = 'j1'") == "waiting"
        await conn.execute(schema.SQL_TRUNCATE)  # truncate() empties every area's table
    finally:
        await conn.close()
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        await admin.close()


async def test_an_older_database_gains_job_counts_that_count_its_jobs(pg_dsn):
    """The counters `status` reads (MIGRATION_JOB_COUNTS) start from the jobs already
    there (running ones are read as leases), then follow every write."""
    from coordd.store.postgres import reads, schema
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_dsn)
    await admin.execute(f"CREATE DATABASE {name}")
    conn = await asyncpg.connect(pg_dsn.replace("/postgres?", f"/{name}?"))
    try:
        await schema.migrate(conn, target=schema.MIGRATIONS.index(schema.MIGRATION_JOB_COUNTS))
        await conn.execute(SQL_THIRTY_JOBS)
        assert await schema.migrate(conn) == schema.SCHEMA_VERSION
        await conn.execute("UPDATE jobs SET status = 'cancelled' WHERE job_id = 'j1'")
        st = await reads.status(conn, 100.0, 30.0)
        assert {k: v for k, v in st.jobs.items() if v} == {
            "waiting": 19, "succeeded": 10, "cancelled": 1}
        assert st.waiting_by_priority == {"p0": 5, "p1": 5, "p2": 5, "p3": 4}
    finally:
        await conn.close()
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        await admin.close()


async def test_one_update_of_many_jobs_keeps_the_counts_and_tells_wait_job(pg_dsn):
    """MIGRATION_JOBS_UPDATED (one statement trigger for every UPDATE of jobs): a database
    migrated from the row triggers keeps its counts; one statement moving jobs between
    statuses and priorities (and rows it leaves as they were) moves the counters as a
    recount does; a job that ends sends its `t` NOTIFY once, while a wait is wanted."""
    import asyncio

    from coordd.store.postgres import push_sql, reads, schema
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_dsn)
    await admin.execute(f"CREATE DATABASE {name}")
    conn = await asyncpg.connect(pg_dsn.replace("/postgres?", f"/{name}?"))
    heard: list[str] = []
    try:
        await schema.migrate(conn, target=schema.MIGRATIONS.index(
            schema.MIGRATION_JOBS_UPDATED))  # the row triggers
        await conn.execute(SQL_THIRTY_JOBS)
        assert await schema.migrate(conn) == schema.SCHEMA_VERSION
        await conn.add_listener(push_sql.PUSH_CHANNEL, lambda *a: heard.append(a[3]))
        await conn.execute(push_sql.SQL_WANT, "t", 60.0)
        await conn.execute(  # j1 -> cancelled, j3 succeeded -> waiting, j2 priority 2 -> 0,
            # j4 (waiting) and j6 (succeeded) rewritten as they are, j5 -> succeeded
            "UPDATE jobs SET status = CASE job_id WHEN 'j1' THEN 'cancelled' "
            "WHEN 'j3' THEN 'waiting' WHEN 'j5' THEN 'succeeded' ELSE status END, "
            "priority = CASE job_id WHEN 'j2' THEN 0 ELSE priority END "
            "WHERE job_id IN ('j1', 'j2', 'j3', 'j4', 'j5', 'j6')")
        counted = {(r[0], r[1]): r[2] for r in await conn.fetch(
            "SELECT status, priority, count(*) FROM jobs GROUP BY 1, 2")}
        st = await reads.status(conn, 100.0, 30.0)
        assert {k: v for k, v in st.jobs.items() if v} == {
            "waiting": 19, "succeeded": 10, "cancelled": 1}
        assert st.waiting_by_priority == {
            f"p{p}": counted.get(("waiting", p), 0) for p in range(4)}
        for _ in range(50):
            if len(heard) >= 2:
                break
            await asyncio.sleep(0.02)
        assert sorted(heard) == ["tj1", "tj5"]  # not j6: it had ended before
    finally:
        await conn.close()
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        await admin.close()


async def test_a_key_taken_before_the_partial_key_index_stays_taken(pg_dsn):
    """MIGRATION_KEY_PARTIAL (jobs' idempotency key: a unique index of the keyed jobs
    only): a key stored under the old constraint still returns its job, jobs without a key
    are as many as wanted, and a key is still unique under concurrent enqueues."""
    import asyncio

    from coordd.ids import JobIds
    from coordd.store.api import NewJob
    from coordd.store.postgres import PostgresStore, schema
    ids = JobIds()

    def job(key: str | None = None) -> NewJob:
        return NewJob(job_id=ids.new(1.0), kind="k", required_role="cpu", priority=2,
                      payload_json="{}", run_at=None, max_attempts=3, idempotency_key=key,
                      max_runtime_s=None, gates_json=None, request_sha256="h")

    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_dsn)
    await admin.execute(f"CREATE DATABASE {name}")
    dsn = pg_dsn.replace("/postgres?", f"/{name}?")
    conn = await asyncpg.connect(dsn)
    store = PostgresStore(dsn, pool_min=1, pool_max=6)
    try:
        await schema.migrate(conn, target=schema.MIGRATIONS.index(schema.MIGRATION_KEY_PARTIAL))
        await conn.execute("INSERT INTO jobs (job_id, kind, required_role, priority, "
                           "payload_json, status, max_attempts, run_at, queued_at, "
                           "created_at, updated_at, idempotency_key, request_sha256) VALUES ('j1', "
                           "'k', 'cpu', 2, '{}', 'waiting', 3, 1, 1, 1, 1, 'order-1', 'h')")
        await store.start()  # migrates to the partial index
        again = await store.enqueue([job("order-1")])
        assert again[0].job_id == "j1" and not again[0].created
        plain = await store.enqueue([job() for _ in range(3)])
        assert all(r.created for r in plain)
        raced = await asyncio.gather(*(store.enqueue([job("order-2")])
                                       for _ in range(6)))
        assert sum(r[0].created for r in raced) == 1
        assert len({r[0].job_id for r in raced}) == 1
    finally:
        await store.close()
        await conn.close()
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        await admin.close()
