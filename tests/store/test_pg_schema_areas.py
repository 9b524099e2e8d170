"""PostgreSQL only: a database made by a coordd before the hub, job logs and enrolment
tokens gains their tables on upgrade, its jobs untouched."""

from __future__ import annotations

import uuid

import pytest

asyncpg = pytest.importorskip("asyncpg", reason="asyncpg is not installed")


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
        await conn.execute("INSERT INTO jobs (job_id, kind, required_role, priority, "
                           "payload_json, status, max_attempts, run_at, queued_at, "
                           "created_at, updated_at) SELECT 'j' || g, 'k', 'cpu', g % 4, '{}', "
                           "CASE WHEN g % 3 = 0 THEN 'succeeded' ELSE 'waiting' END, 3, 1, 1, "
                           "1, 1 FROM generate_series(1, 30) g")
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
