"""The bare asyncpg SKIP LOCKED loop: PostgreSQL's baseline in bench/store.py.

The lab schema of shared/FLEET.md B3 (one table, a partial claim index, the lease in the
job row): what a claim + fenced complete costs with nothing of coordd around it.
"""

from __future__ import annotations

SQL_SETUP = """
DROP TABLE IF EXISTS bare_jobs;
CREATE TABLE bare_jobs (
    job_id bigint PRIMARY KEY, priority int NOT NULL, created_at float8 NOT NULL,
    status text NOT NULL, worker_id text, token bigint NOT NULL DEFAULT 0,
    lease_expires_at float8, payload text NOT NULL, result text
);
CREATE INDEX bare_jobs_claim ON bare_jobs (priority, created_at, job_id) WHERE status = 'waiting';
"""
SQL_FILL = (
    "INSERT INTO bare_jobs (job_id, priority, created_at, status, payload) "
    "SELECT g, g % 4, g, 'waiting', '{}' FROM generate_series(1, $1) g"
)
SQL_CLAIM = (
    "WITH c AS MATERIALIZED (SELECT job_id FROM bare_jobs WHERE status = 'waiting' "
    "ORDER BY priority, created_at, job_id LIMIT 1 FOR UPDATE SKIP LOCKED) "
    "UPDATE bare_jobs j SET status = 'running', worker_id = $1, token = j.token + 1, "
    "lease_expires_at = extract(epoch FROM now()) + 30 FROM c WHERE j.job_id = c.job_id "
    "RETURNING j.job_id, j.token"
)
SQL_COMPLETE = (
    "UPDATE bare_jobs SET status = 'succeeded', result = $4 WHERE job_id = $1 "
    "AND worker_id = $2 AND token = $3 AND lease_expires_at > extract(epoch FROM now())"
)
SQL_DROP = "DROP TABLE IF EXISTS bare_jobs"
