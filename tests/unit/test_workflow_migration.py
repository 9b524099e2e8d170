"""The v2 -> v5 migration (workflows, issue 8): a database written by coordd before
workflows keeps its jobs, leases, events and idempotency keys, passes the integrity check,
and gets the claim index rebuilt; its old jobs are still claimed."""

from __future__ import annotations

import sqlite3

from coordd import store
from coordd.clock import FakeClock
from coordd.store import schema
from coordd.wire.protocol import Claim, Enqueue, Heartbeat, JobId
from tests.conftest import T0
from tests.unit.test_workflows import open_coord


V2_SCHEMA = schema.MIGRATIONS[:2]


async def test_migration_from_v2_keeps_jobs_leases_and_claim_index(tmp_path):
    path = str(tmp_path / "v2.db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys=ON")
    for script in V2_SCHEMA:
        for stmt in schema._split(script):
            conn.execute(stmt)
    conn.execute("PRAGMA user_version = 2")
    rows = [("j1", "waiting"), ("j2", "running"), ("j3", "succeeded")]
    for job_id, status in rows:
        conn.execute(
            "INSERT INTO jobs (job_id, kind, required_role, priority, payload_json, status, "
            "attempts, max_attempts, run_at, queued_at, created_at, updated_at, "
            "idempotency_key, last_token, result_json) "
            "VALUES (?, 'k', 'cpu', 1, '{\"a\": 1}', ?, 1, 3, ?, ?, ?, ?, ?, 1, ?)",
            (job_id, status, T0, T0, T0, T0, f"key-{job_id}",
             '{"r": 1}' if status == "succeeded" else None))
    conn.execute("INSERT INTO leases (job_id, worker_id, token, granted_at, expires_at, "
                 "lease_s) VALUES ('j2', 'w1', 1, ?, ?, 600)", (T0, T0 + 600))
    conn.execute("INSERT INTO job_events (job_id, at, to_status, reason) "
                 "VALUES ('j1', ?, 'waiting', 'enqueued')", (T0,))
    conn.close()

    coord = await open_coord(path, FakeClock(T0 + 1))
    try:
        assert (await coord.check()) == {"quick_check": "ok", "foreign_key_violations": 0,
                                         "invariants": []}
        for job_id, status in rows:
            view = await coord.get_job(JobId(job_id=job_id))
            assert view.status == status and view.payload == {"a": 1}
        j2 = await coord.get_job(JobId(job_id="j2"))
        assert j2.lease is not None and j2.lease.worker_id == "w1"  # no cascade on rebuild
        assert (await coord.get_job(JobId(job_id="j3"))).result == {"r": 1}
        assert [e.reason for e in (await coord.get_job(JobId(job_id="j1"))).events] == ["enqueued"]
        # the idempotency key still dedups, and the old job is still claimable
        again = await coord.enqueue(Enqueue(kind="k", required_role="cpu", priority=1,
                                            idempotency_key="key-j1"))
        assert (again.job_id, again.created) == ("j1", False)
        await coord.heartbeat(Heartbeat(worker_id="w2", roles=["cpu"],
                                        readings={"memory_used_pct": 10.0}))
        got = await coord.claim(Claim(worker_id="w2", lease_s=30))
        assert got.job is not None and got.job.job_id == "j1"
    finally:
        await coord.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == store.SCHEMA_VERSION
    claim_sql = conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'jobs_claim'").fetchone()[0]
    assert "WHERE status = 'waiting'" in claim_sql
    conn.close()
