"""A job's captured model output: the `job_logs` table, its migration and every statement.

Kept bounded where it is written: per attempt (lease token) and stream the newest
`KEEP_BYTES` (and at most `KEEP_CHUNKS` chunks), and the newest `KEEP_ATTEMPTS` attempts
of a job. Rows go with their job (ON DELETE CASCADE: pruned with it).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

from coordd import errors
from coordd.wire.logs import LOG_KEEP_BYTES as KEEP_BYTES
from coordd.wire.logs import JobLogs, LogChunk

KEEP_CHUNKS = 512
KEEP_ATTEMPTS = 5

# The migration: one self-contained script (appended to store.MIGRATIONS).
MIGRATION = """
CREATE TABLE job_logs (
    seq       INTEGER PRIMARY KEY,
    job_id    TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
    token     INTEGER NOT NULL,
    attempt   INTEGER NOT NULL,
    worker_id TEXT NOT NULL,
    stream    TEXT NOT NULL CHECK (stream IN ('stdout', 'stderr')),
    pos       INTEGER NOT NULL CHECK (pos >= 0),
    data      BLOB NOT NULL,
    at        REAL NOT NULL,
    UNIQUE (job_id, token, stream, pos)
);
CREATE INDEX job_logs_job ON job_logs (job_id, seq);
"""

SQL_LOG_INSERT = (
    "INSERT OR IGNORE INTO job_logs (job_id, token, attempt, worker_id, stream, pos, data, at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
SQL_LOG_END = (
    "SELECT max(pos + length(data)) FROM job_logs WHERE job_id = ? AND token = ? AND stream = ?"
)
SQL_LOG_TRIM_BYTES = (
    "DELETE FROM job_logs WHERE job_id = ? AND token = ? AND stream = ? "
    "AND pos + length(data) <= ?"
)
SQL_LOG_TRIM_CHUNKS = (
    "DELETE FROM job_logs WHERE job_id = ?1 AND token = ?2 AND stream = ?3 AND pos < ("
    "SELECT pos FROM job_logs WHERE job_id = ?1 AND token = ?2 AND stream = ?3 "
    "ORDER BY pos DESC LIMIT 1 OFFSET ?4)"
)
SQL_LOG_TRIM_ATTEMPTS = (
    "DELETE FROM job_logs WHERE job_id = ?1 AND token NOT IN ("
    "SELECT DISTINCT token FROM job_logs WHERE job_id = ?1 ORDER BY token DESC LIMIT ?2)"
)
SQL_LOG_READ = (
    "SELECT seq, attempt, token, worker_id, stream, pos, data, at FROM job_logs "
    "WHERE job_id = ?1 AND seq > ?2 AND (?3 IS NULL OR attempt = ?3) ORDER BY seq"
)
SQL_JOB_STATUS = "SELECT status FROM jobs WHERE job_id = ?"


def append(conn: sqlite3.Connection, now: float, job_id: str, token: int, attempt: int,
           worker_id: str, stream: str, pos: int, data: bytes) -> bool:
    """Store one chunk (inside the writer's transaction; the lease is checked by the
    caller) and trim what is past the bounds; True if it was new."""
    stored = conn.execute(SQL_LOG_INSERT, (job_id, token, attempt, worker_id, stream, pos,
                                           data, now)).rowcount == 1
    if stored:
        end = conn.execute(SQL_LOG_END, (job_id, token, stream)).fetchone()[0]
        conn.execute(SQL_LOG_TRIM_BYTES, (job_id, token, stream, end - KEEP_BYTES))
        conn.execute(SQL_LOG_TRIM_CHUNKS, (job_id, token, stream, KEEP_CHUNKS - 1))
        conn.execute(SQL_LOG_TRIM_ATTEMPTS, (job_id, KEEP_ATTEMPTS))
    return stored


def read(conn: sqlite3.Connection, job_id: str, after: int, attempt: int | None,
         limit_bytes: int) -> tuple[str | None, list[tuple[Any, ...]], bool]:
    """(the job's status or None if no such job, chunk rows after `after` in seq order up
    to `limit_bytes` of data (at least one), whether more are left)."""
    row = conn.execute(SQL_JOB_STATUS, (job_id,)).fetchone()
    if row is None:
        return None, [], False
    return (row[0], *take(conn.execute(SQL_LOG_READ, (job_id, after, attempt)), limit_bytes))


def take(rows: Iterable[tuple[Any, ...]], limit_bytes: int
         ) -> tuple[list[tuple[Any, ...]], bool]:
    """The chunk rows (data 7th) of one reply: in order while their data fits
    `limit_bytes`, the first always; and whether rows were left. Pure (both stores)."""
    out: list[tuple[Any, ...]] = []
    total = 0
    for chunk in rows:
        if out and total + len(chunk[6]) > limit_bytes:
            return out, True
        out.append(chunk)
        total += len(chunk[6])
    return out, False


def view(job_id: str, after: int, status: str | None, rows: list[tuple[Any, ...]],
         more: bool) -> JobLogs:
    """The `job_logs` reply from `read`'s result. Pure (both stores).

    Raises: errors.NotFound (status None: no such job).
    """
    if status is None:
        raise errors.NotFound(f"job {job_id} not found")
    chunks = [LogChunk(seq=seq, attempt=attempt, token=token, worker_id=worker, stream=stream,
                       pos=pos, data=bytes(data), at=at)
              for seq, attempt, token, worker, stream, pos, data, at in rows]
    return JobLogs(job_id=job_id, status=status, chunks=chunks,
                   next_after=chunks[-1].seq if chunks else after, more=more)
