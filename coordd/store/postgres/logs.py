"""A job's captured output on PostgreSQL (coordd.store.api_logs.LogStore): its statements
and the mixin PostgresStore inherits. Bounds and replies are coordd.store.logs'.

Appends of one job run under a transaction advisory lock on its id: the chunk's `seq` is
taken and committed under it, so a job's chunks commit in `seq` order and a reader
following by cursor (`after`) never skips one committed late (SQLite's single writer
gives that order), and two trims of one job never interleave. The fence holds the lease
row (FOR KEY SHARE) until the chunk is stored: a complete or a reap waits, not races.
"""

from __future__ import annotations

from typing import Any

from coordd.wire.logs import JobLogs
from coordd.store import logs as log_store
from coordd.store.api import LeaseRef
from coordd.store.postgres import fence
from coordd.store.postgres.sql import NOW

SQL_LOG_LOCK = "SELECT pg_advisory_xact_lock(hashtext('coordd-logs'), hashtext($1))"
# $2 job, $3 worker, $4 token, $5 stream, $6 pos, $7 data: (fenced, stored) as 0/1 counts
SQL_LOG_APPEND = (
    "WITH f AS (SELECT j.attempts FROM leases l JOIN jobs j ON j.job_id = l.job_id "
    f"WHERE l.job_id = $2 AND l.worker_id = $3 AND l.token = $4 AND l.expires_at > {NOW} "
    "FOR KEY SHARE OF l), "
    "i AS (INSERT INTO job_logs (job_id, token, attempt, worker_id, stream, pos, data, at) "
    f"SELECT $2, $4, f.attempts, $3, $5, $6, $7, {NOW} FROM f "
    "ON CONFLICT (job_id, token, stream, pos) DO NOTHING RETURNING 1) "
    "SELECT (SELECT count(*) FROM f), (SELECT count(*) FROM i)"
)
_STREAM = "job_id = $1 AND token = $2 AND stream = $3"
SQL_LOG_TRIM_BYTES = (  # $4 bytes kept: chunks ending at or before (end - $4) go
    f"DELETE FROM job_logs WHERE {_STREAM} AND pos + octet_length(data) <= "
    f"(SELECT max(pos + octet_length(data)) FROM job_logs WHERE {_STREAM}) - $4"
)
SQL_LOG_TRIM_CHUNKS = (  # $4 chunks kept, less one
    f"DELETE FROM job_logs WHERE {_STREAM} AND pos < (SELECT pos FROM job_logs "
    f"WHERE {_STREAM} ORDER BY pos DESC LIMIT 1 OFFSET $4)"
)
SQL_LOG_TRIM_ATTEMPTS = (  # $1 job, $2 attempts kept
    "DELETE FROM job_logs WHERE job_id = $1 AND token NOT IN (SELECT DISTINCT token "
    "FROM job_logs WHERE job_id = $1 ORDER BY token DESC LIMIT $2)"
)
SQL_LOG_JOB_STATUS = "SELECT status FROM jobs WHERE job_id = $1"
# $1 job, $2 after, $3 attempt (NULL: all), $4 limit_bytes: the chunks whose data before
# them is within the limit (all that fit, and the first that does not: coordd.store.logs.take
# then says `more`)
SQL_LOG_READ = (
    "SELECT seq, attempt, token, worker_id, stream, pos, data, at FROM (SELECT *, "
    "sum(octet_length(data)) OVER (ORDER BY seq) - octet_length(data) AS before "
    "FROM job_logs WHERE job_id = $1 AND seq > $2 AND ($3::int IS NULL OR attempt = $3)) x "
    "WHERE before <= $4 ORDER BY seq"
)


class LogOps:
    """LogStore over PostgresStore's pool (`self._conn()`); see the module docstring."""

    _conn: Any

    async def log_append(self, ref: LeaseRef, stream: str, pos: int, data: bytes, *,
                         now: float | None = None) -> bool:
        """Fence and store the chunk, then trim past coordd.store.logs' bounds, in one
        transaction. Raises: the fencing errors (coordd.rules.transitions.fence)."""
        async with self._conn() as conn, conn.transaction():
            await conn.execute(SQL_LOG_LOCK, ref.job_id)
            fenced, stored = await conn.fetchrow(SQL_LOG_APPEND, now, ref.job_id,
                                                 ref.worker_id, ref.token, stream, pos, data)
            if not fenced:
                raise await fence.refusal(conn, now, ref)
            if stored:
                key = (ref.job_id, ref.token, stream)
                await conn.execute(SQL_LOG_TRIM_BYTES, *key, log_store.KEEP_BYTES)
                await conn.execute(SQL_LOG_TRIM_CHUNKS, *key, log_store.KEEP_CHUNKS - 1)
                await conn.execute(SQL_LOG_TRIM_ATTEMPTS, ref.job_id, log_store.KEEP_ATTEMPTS)
        return bool(stored)

    async def job_logs(self, job_id: str, after: int, attempt: int | None,
                       limit_bytes: int, *, now: float | None = None) -> JobLogs:
        """The job's status, then its chunks after `after` (coordd.store.logs.view).
        Raises: errors.NotFound."""
        async with self._conn() as conn:
            status = await conn.fetchval(SQL_LOG_JOB_STATUS, job_id)
            rows: list[Any] = []
            if status is not None:
                rows = await conn.fetch(SQL_LOG_READ, job_id, after, attempt, limit_bytes)
        taken, more = log_store.take((tuple(r) for r in rows), limit_bytes)
        return log_store.view(job_id, after, status, taken, more)
