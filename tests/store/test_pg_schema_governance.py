"""PostgreSQL only: a database made by a coordd before governance gains its columns and
tables on upgrade; a lease held across the upgrade runs normally (no suspension, no
grant), its worker as one that never said goodbye."""

from __future__ import annotations

import uuid

import pytest

asyncpg = pytest.importorskip("asyncpg", reason="asyncpg is not installed")


async def test_an_older_database_gains_governance_with_its_leases_untouched(pg_dsn):
    from coordd.store.postgres import schema
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_dsn)
    await admin.execute(f"CREATE DATABASE {name}")
    conn = await asyncpg.connect(pg_dsn.replace("/postgres?", f"/{name}?"))
    try:
        await schema.migrate(conn, target=schema.MIGRATIONS.index(schema.MIGRATION_GOVERNANCE))
        await conn.execute("INSERT INTO workers VALUES ('w', '[\"cpu\"]', '{}', 1, 1)")
        await conn.execute("INSERT INTO jobs (job_id, kind, required_role, priority, "
                           "payload_json, status, max_attempts, run_at, queued_at, "
                           "created_at, updated_at, attempts, last_token) VALUES ('j1', 'k', "
                           "'cpu', 3, '{}', 'running', 3, 1, 1, 1, 1, 1, 1)")
        await conn.execute("INSERT INTO leases (job_id, worker_id, token, granted_at, "
                           "expires_at, lease_s) VALUES ('j1', 'w', 1, 1, 31, 30)")
        assert await schema.migrate(conn) == schema.SCHEMA_VERSION
        for table in ("reservations", "job_resources"):
            assert await conn.fetchval("SELECT to_regclass($1)::text", table) == table
        row = await conn.fetchrow("SELECT suspended_at, vacate_reason, gpu_ids, ram_mb, token "
                                  "FROM leases WHERE job_id = 'j1'")
        assert tuple(row) == (None, None, None, None, 1)
        assert await conn.fetchval("SELECT offline_at IS NULL AND incarnation IS NULL "
                                   "FROM workers WHERE worker_id = 'w'")
        await conn.execute(schema.SQL_TRUNCATE)
    finally:
        await conn.close()
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        await admin.close()
