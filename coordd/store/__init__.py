"""The stores: the store interface every store implements (api.py, api_*.py), the SQLite
store (sqlite/) and the PostgreSQL store (postgres/); here and in the modules beside
api*.py, SQLite's statements. May import net, ops, rules, wire and the base modules; never
service or daemon (the layers contract).

Every SQL statement coordd runs on jobs and leases, and `apply`, which writes the job
transitions coordd.rules.transitions decides; the schema (migrations, PRAGMAs) is
coordd.store.schema, re-exported here.

Functions here are synchronous and take an open `sqlite3.Connection` plus `now` (Unix
seconds from coordd's clock: no SQL reads the time itself). Write functions are only
called by `coordd.store.sqlite.writer.Writer`, inside its `BEGIN IMMEDIATE` transaction; raising a
`CoordError` rolls back that request alone (see the writer for how).

Every SQL string lives here or in a submodule (coordd.store.*). Which transition a job
takes is decided in `coordd.rules.transitions` (pure); `apply` writes a decision. Claims and
the fenced lease-holder calls are in `coordd.store.sqlite.leases`, row -> view conversion in
`coordd.store.views`.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import msgspec

from coordd.jsontext import (  # noqa: F401 (re-exported: coordd.store has always named them)
    UNDECODABLE_SHOWN_CHARS, dumps, json_decode, json_encode, lenient_json, maybe_json,
)
from coordd.wire.protocol import EnqueueResult, StatusResult
from coordd import errors
from coordd.rules import transitions as tr
from coordd.rules.transitions import CANCELLED_BY_ADMIN, Decision  # noqa: F401 (re-exported)
from coordd.store import limits as _limits, resources as _resources_schema
from coordd.store import job_requests as _job_requests
from coordd.store.claim_index import (  # noqa: F401 (the claim's statements)
    SQL_ANY_RUNNABLE, SQL_PAIR_LEVEL, SQL_PAIR_WALK, SQL_ROLE_KINDS,
)
from coordd.store import schema as _schema
from coordd.store.schema import (  # noqa: F401 (the schema, as coordd.store has always named it)
    MIGRATIONS, PRAGMA_AUTO_VACUUM, PRAGMA_CHECKPOINT_TRUNCATE,
    PRAGMA_FOREIGN_KEY_CHECK, PRAGMA_JOURNAL_SIZE_LIMIT, PRAGMA_QUICK_CHECK,
    PRAGMA_WAL_AUTOCHECKPOINT, PRAGMAS_WRITER, SCHEMA_VERSION, SQL_COUNT_TABLES,
    _split, prepare_new_file,
)

CLAIM_SCAN = 16  # candidates looked at per priority level before giving up on that level
PRUNE_BATCH = 50  # terminal jobs deleted per transaction by `prune_batch` (~2 ms)
VACUUM_PAGES = 128  # free pages returned to the file system per transaction (~2 ms)
ANALYSIS_LIMIT = 400  # index rows ANALYZE samples per index (SQLite's advice for optimize)


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema to SCHEMA_VERSION (coordd.store.schema.migrate); return it.

    Raises:
        errors.StoreError: the file is from a newer coordd, or is not a coordd database.
    """
    return _schema.migrate(conn, SCHEMA_VERSION)




# ---------------------------------------------------------------- events


SQL_EVENT = (
    "INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)


def event(conn: sqlite3.Connection, job_id: str, now: float, worker_id: str | None,
           from_status: str | None, to_status: str, reason: str | None) -> None:
    """Log an event; a status change's event comes with its coordd.rules.transitions row (a
    same-status note, e.g. a governance action, names the status twice)."""
    conn.execute(SQL_EVENT, (job_id, now, worker_id, from_status, to_status, reason))


def apply(conn: sqlite3.Connection, now: float, job_id: str, worker_id: str | None,
          d: Decision, artifact_sha256: str | None = None) -> None:
    """Write one decision of coordd.rules.transitions (every job-status write but the insert,
    the claim's take and the workflow node moves of coordd.store.workflows): the lease
    row goes if `d.drop_lease`, the job row gets the statement of `d.t`, and the event is
    logged. `artifact_sha256`: a succeeded job's artifact (its row inserted by the caller).

    Raises:
        ValueError: `d.t` is a transition with its own statement elsewhere (a bug).
    """
    t = d.t
    if d.drop_lease:
        conn.execute(SQL_DELETE_LEASE, (job_id,))
    to, cause = t.to_status, t.cause
    if to == "succeeded":
        conn.execute(SQL_SUCCEED, (d.result_json, artifact_sha256, now, now, job_id))
    elif to == "waiting":
        if cause == tr.RELEASE:
            conn.execute(SQL_RELEASE, (d.last_error, d.run_at, now, now, job_id))
        elif cause == tr.RETRY:
            conn.execute(SQL_RETRY, (d.run_at, now, now, job_id))
        elif t.from_status == "running":  # fail, result_invalid, a lost lease: requeued
            conn.execute(SQL_TO_WAITING, (d.last_error, d.run_at, now, now, job_id))
        else:
            raise ValueError(f"store.apply does not write {t}")
    elif cause == tr.DEAD_LETTER:
        conn.execute(SQL_DEAD_LETTER, (int(d.count_attempt), now, now, d.last_error, job_id))
    elif t is tr.CANCEL_REQUEST:
        conn.execute(SQL_REQUEST_CANCEL, (now, job_id))
    elif to in ("failed", "cancelled"):  # a terminal status, cancel request cleared
        conn.execute(SQL_TO_TERMINAL, (to, d.last_error, now, now, job_id))
    else:  # the claim's take, enqueue and workflow node moves have their own statements
        raise ValueError(f"store.apply does not write {t}")
    conn.execute(SQL_EVENT, (job_id, now, worker_id, t.from_status, to, d.reason))


# ---------------------------------------------------------------- heartbeat


SQL_HEARTBEAT = (
    "INSERT INTO workers (worker_id, roles_json, heartbeat_json, heartbeat_at, first_seen_at) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (worker_id) DO UPDATE SET "
    "roles_json = excluded.roles_json, heartbeat_json = excluded.heartbeat_json, "
    "heartbeat_at = excluded.heartbeat_at"
)
SQL_CANCEL_REQUESTED_FOR_WORKER = (
    "SELECT l.job_id FROM leases l JOIN jobs j ON j.job_id = l.job_id "
    "WHERE l.worker_id = ? AND j.cancel_requested = 1"
)


def heartbeat(conn: sqlite3.Connection, now: float, worker_id: str, roles_json: str,
              readings_json: str) -> list[str]:
    """Record a heartbeat (coordd's clock); return the ids of jobs this worker holds whose
    cancel was requested. `roles_json` and `readings_json` are encoded by the caller."""
    conn.execute(SQL_HEARTBEAT, (worker_id, roles_json, readings_json, now, now))
    return [r[0] for r in conn.execute(SQL_CANCEL_REQUESTED_FOR_WORKER, (worker_id,))]


# ---------------------------------------------------------------- enqueue


class NewJob(msgspec.Struct, kw_only=True):
    """A validated job ready to insert (sizes already checked, JSON already encoded)."""

    job_id: str
    kind: str
    required_role: str
    priority: int
    payload_json: str
    run_at: float | None
    max_attempts: int
    idempotency_key: str | None
    max_runtime_s: float | None
    gates_json: str | None
    result_schema: str | None = None
    delay_s: float | None = None  # run_at is then now + delay_s (coordd's clock)
    request_sha256: str | None = None  # with an idempotency key: the request's hash
    resources: Any = None  # a coordd.rules.resources.Request (stored in coordd.store.resources)
    limits: list[tuple[str, int]] = []  # fleet-wide limits it consumes (name, units)


SQL_ENQUEUE = (
    "INSERT INTO jobs (job_id, kind, required_role, priority, payload_json, status, "
    "max_attempts, run_at, queued_at, created_at, updated_at, idempotency_key, "
    "max_runtime_s, gates_json, result_schema, request_sha256) "
    "VALUES (?, ?, ?, ?, ?, 'waiting', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (idempotency_key) DO NOTHING RETURNING job_id"
)


def enqueue(conn: sqlite3.Connection, now: float, job: NewJob) -> EnqueueResult:
    """Insert a waiting job. A repeated idempotency key with the same request hash returns
    the existing job (created=False); a job stored before v9 has no hash, and any request
    with its key is taken as the same.

    Raises:
        errors.InvalidState: the key names a job made by another request.
    """
    run_at = job.run_at if job.run_at is not None else now + (job.delay_s or 0.0)
    row = conn.execute(SQL_ENQUEUE, (
        job.job_id, job.kind, job.required_role, job.priority, job.payload_json,
        job.max_attempts, run_at, now, now, now,
        job.idempotency_key, job.max_runtime_s, job.gates_json, job.result_schema,
        job.request_sha256)).fetchone()
    if row is None:
        existing = _job_requests.repeated(conn, job.idempotency_key, job.request_sha256)
        return EnqueueResult(job_id=existing, created=False)
    _resources_schema.add_request(conn, job.job_id, job.resources)
    _limits.attach(conn, job.job_id, job.limits)  # the fleet-wide limits it names, if any
    t = tr.ENQUEUED
    event(conn, job.job_id, now, None, t.from_status, t.to_status, "enqueued")
    return EnqueueResult(job_id=job.job_id, created=True)


# ---------------------------------------------------------------- claim


SQL_WORKER = "SELECT roles_json, heartbeat_json, heartbeat_at FROM workers WHERE worker_id = ?"
SQL_LEASE_BY_CLAIM_ID = (
    "SELECT job_id, token, expires_at, lease_s FROM leases "
    "WHERE worker_id = ? AND claim_id = ? AND expires_at > ?"
)
# Candidate walks over the claim index: coordd.store.claim_index (imported here).
SQL_TAKE = (
    "UPDATE jobs SET status = 'running', attempts = attempts + 1, "
    "last_token = last_token + 1, updated_at = ? WHERE job_id = ? AND status = 'waiting' "
    "RETURNING kind, required_role, priority, payload_json, attempts, checkpoint_json, "
    "max_runtime_s, last_token"
)
SQL_INSERT_LEASE = (
    "INSERT INTO leases (job_id, worker_id, token, claim_id, granted_at, expires_at, lease_s) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
SQL_CLAIMED_JOB = (
    "SELECT kind, required_role, priority, payload_json, attempts, checkpoint_json, "
    "max_runtime_s FROM jobs WHERE job_id = ?"
)
SQL_DEAD_LETTER = (
    "UPDATE jobs SET status = 'failed', attempts = attempts + ?, updated_at = ?, "
    "finished_at = ?, last_error = ? WHERE job_id = ?"
)


# ---------------------------------------------------------------- lease holder calls


SQL_JOB_FOR_LEASE = (
    "SELECT j.status, j.cancel_requested, j.max_runtime_s, j.attempts, j.max_attempts, "
    "j.last_token, l.worker_id, l.token, l.granted_at, l.expires_at, j.result_schema, "
    "j.workflow_id FROM jobs j LEFT JOIN leases l ON l.job_id = j.job_id WHERE j.job_id = ?"
)
SQL_RENEW = "UPDATE leases SET expires_at = ?, lease_s = ? WHERE job_id = ?"
SQL_CHECKPOINT = "UPDATE jobs SET checkpoint_json = ?, updated_at = ? WHERE job_id = ?"
SQL_DELETE_LEASE = "DELETE FROM leases WHERE job_id = ?"
SQL_SUCCEED = (
    "UPDATE jobs SET status = 'succeeded', result_json = ?, artifact_sha256 = ?, "
    "updated_at = ?, finished_at = ?, last_error = NULL WHERE job_id = ?"
)
SQL_INSERT_ARTIFACT = (
    "INSERT INTO artifacts (sha256, path, size, created_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (sha256) DO NOTHING"
)
SQL_TO_TERMINAL = (
    "UPDATE jobs SET status = ?, last_error = ?, updated_at = ?, finished_at = ?, "
    "cancel_requested = 0 WHERE job_id = ?"
)
SQL_TO_WAITING = (
    "UPDATE jobs SET status = 'waiting', last_error = ?, run_at = ?, queued_at = ?, "
    "updated_at = ? WHERE job_id = ?"
)
SQL_RELEASE = (
    "UPDATE jobs SET status = 'waiting', attempts = max(0, attempts - 1), "
    "preemptions = preemptions + 1, last_error = ?, run_at = ?, queued_at = ?, "
    "updated_at = ? WHERE job_id = ?"
)


# ---------------------------------------------------------------- admin transitions


SQL_JOB_STATUS = "SELECT status FROM jobs WHERE job_id = ?"
SQL_REQUEST_CANCEL = "UPDATE jobs SET cancel_requested = 1, updated_at = ? WHERE job_id = ?"
SQL_RETRY = (
    "UPDATE jobs SET status = 'waiting', attempts = 0, run_at = ?, queued_at = ?, "
    "updated_at = ?, finished_at = NULL, cancel_requested = 0, last_error = NULL "
    "WHERE job_id = ?"
)


def _status(conn: sqlite3.Connection, job_id: str) -> str:
    row = conn.execute(SQL_JOB_STATUS, (job_id,)).fetchone()
    if row is None:
        raise errors.NotFound(f"job {job_id} not found")
    return row[0]


def cancel(conn: sqlite3.Connection, now: float, job_id: str) -> StatusResult:
    """Cancel (coordd.rules.transitions.cancel): waiting (or blocked) -> cancelled at once;
    running -> cancel requested (the holder learns it from `renew`/`heartbeat` and ends
    it); cancelled stays cancelled. Returns the status after.

    Raises:
        errors.NotFound: no such job.
        errors.InvalidState: the job already succeeded or failed.
    """
    d = tr.cancel(_status(conn, job_id), job_id)
    if d is None:
        return StatusResult(status="cancelled")
    apply(conn, now, job_id, None, d)
    return StatusResult(status=d.t.to_status)


def retry(conn: sqlite3.Connection, now: float, job_id: str) -> StatusResult:
    """Put a failed (dead letter), cancelled or skipped job back to waiting, attempts reset
    (coordd.rules.transitions.retry).

    Raises:
        errors.NotFound: no such job.
        errors.InvalidState: the job is waiting, running or succeeded.
    """
    d = tr.retry(_status(conn, job_id), job_id, now)
    apply(conn, now, job_id, None, d)
    return StatusResult(status="waiting", run_at=now)


# ---------------------------------------------------------------- reaper


SQL_EXPIRED = (
    "SELECT l.job_id, l.worker_id, j.attempts, j.max_attempts, j.cancel_requested "
    "FROM leases l JOIN jobs j ON j.job_id = l.job_id WHERE l.expires_at <= ? "
    "ORDER BY l.expires_at LIMIT ?"
)


def reap_expired(conn: sqlite3.Connection, now: float, limit: int = 1000) -> int:
    """Return jobs whose lease has expired (`expires_at <= now`) to waiting, at the back of
    their priority (queued_at = now, so a job that keeps hanging cannot monopolize the
    head of the queue), or to `failed` once attempts are spent, or `cancelled` if a
    cancel was requested. The expired attempt counts (it was counted at claim)."""
    rows = conn.execute(SQL_EXPIRED, (now, limit)).fetchall()
    for job_id, worker_id, attempts, max_attempts, cancel_requested in rows:
        end_lost_lease(conn, now, job_id, worker_id, attempts, max_attempts,
                       cancel_requested, "lease_expired")
    return len(rows)


def end_lost_lease(conn: sqlite3.Connection, now: float, job_id: str, worker_id: str,
                   attempts: int, max_attempts: int, cancel_requested: int, code: str) -> None:
    """End a lease whose holder is gone (`code`: lease_expired, worker_lost), as
    coordd.rules.transitions.lost_lease decides: waiting at once, at the back of its priority,
    `failed` once its attempts are spent, or `cancelled` if a cancel was requested. The
    attempt counts (it was counted at claim): a job that keeps killing its worker ends in
    the dead letter."""
    apply(conn, now, job_id, worker_id,
          tr.lost_lease(worker_id, attempts, max_attempts, cancel_requested, code, now))


# ---------------------------------------------------------------- retention


# A node of a workflow goes only with its whole graph: once the workflow has ended, and
# ended before the cutoff too (so every node has), never while a dependent may still read
# its result or artifact.
SQL_PRUNE_WHERE = (
    "FROM jobs INDEXED BY jobs_finished WHERE finished_at IS NOT NULL "
    "AND finished_at < ?1 AND status IN ('succeeded', 'failed', 'cancelled', 'skipped') "
    "AND (workflow_id IS NULL OR EXISTS (SELECT 1 FROM workflows w "
    "WHERE w.workflow_id = jobs.workflow_id AND w.status <> 'running' "
    "AND w.finished_at < ?1))"
)
SQL_PRUNE_PICK = "SELECT job_id " + SQL_PRUNE_WHERE + " ORDER BY finished_at LIMIT ?2"
SQL_PRUNABLE = "SELECT count(*) " + SQL_PRUNE_WHERE
# The newest event is kept (its job may go): event ids are rowids, and a deleted maximum
# would be handed out again, under the cursor of a watch_events reader.
SQL_PRUNE_EVENTS = ("DELETE FROM job_events WHERE job_id = ? "
                    "AND event_id < (SELECT max(event_id) FROM job_events)")
SQL_PRUNE_JOB = "DELETE FROM jobs WHERE job_id = ? RETURNING artifact_sha256"
SQL_PRUNE_ARTIFACT = (
    "DELETE FROM artifacts WHERE sha256 = ?1 "
    "AND NOT EXISTS (SELECT 1 FROM jobs WHERE artifact_sha256 = ?1)"
)
SQL_FREELIST_COUNT = "PRAGMA freelist_count"
SQL_AUTO_VACUUM_MODE = "PRAGMA auto_vacuum"
AUTO_VACUUM_INCREMENTAL = 2
SQL_INCREMENTAL_VACUUM = "PRAGMA incremental_vacuum"
SQL_WAL_CHECKPOINT = "PRAGMA wal_checkpoint(PASSIVE)"
SQL_OPTIMIZE = "PRAGMA optimize"  # refreshes the planner's statistics where they went stale
SQL_ANALYSIS_LIMIT = "PRAGMA analysis_limit = {:d}"


def prune_batch(conn: sqlite3.Connection, cutoff: float, limit: int = PRUNE_BATCH
                ) -> tuple[int, int]:
    """Delete up to `limit` terminal jobs finished before `cutoff`, with their events and
    the artifact rows no remaining job references; return (jobs, artifact rows) deleted.

    The artifact files stay: another job may reference the same content-addressed file
    again before a file could be removed, so file clean-up is a separate, offline step.
    """
    ids = [r[0] for r in conn.execute(SQL_PRUNE_PICK, (cutoff, limit)).fetchall()]
    shas: set[str] = set()
    for job_id in ids:
        conn.execute(SQL_PRUNE_EVENTS, (job_id,))
        sha = conn.execute(SQL_PRUNE_JOB, (job_id,)).fetchone()[0]
        if sha is not None:
            shas.add(sha)
    artifacts = sum(conn.execute(SQL_PRUNE_ARTIFACT, (sha,)).rowcount for sha in shas)
    return len(ids), artifacts


def vacuum_step(conn: sqlite3.Connection, max_pages: int = VACUUM_PAGES) -> int:
    """Return up to `max_pages` free pages to the file system; return how many stay free.

    Python's sqlite3 steps a PRAGMA once, and each step of `incremental_vacuum` frees one
    page, hence the loop. A file without incremental auto-vacuum frees nothing (returns 0).
    """
    if conn.execute(SQL_AUTO_VACUUM_MODE).fetchone()[0] != AUTO_VACUUM_INCREMENTAL:
        return 0
    free = conn.execute(SQL_FREELIST_COUNT).fetchone()[0]
    for _ in range(min(free, max_pages)):
        conn.execute(SQL_INCREMENTAL_VACUUM)
    return conn.execute(SQL_FREELIST_COUNT).fetchone()[0]


def optimize(conn: sqlite3.Connection) -> None:
    """Run `PRAGMA optimize` (statistics for the planner, only where they went stale),
    its ANALYZE sampling ANALYSIS_LIMIT rows per index: about a millisecond at any size,
    where a full ANALYZE of 1 M jobs held the writer ~320 ms."""
    conn.execute(SQL_ANALYSIS_LIMIT.format(ANALYSIS_LIMIT))
    conn.execute(SQL_OPTIMIZE).fetchall()


def wal_checkpoint(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """Copy the WAL into the file (outside any transaction); SQLite's (busy, log frames,
    checkpointed frames). PASSIVE never waits for readers (the writer must not stall);
    when it copies every frame SQLite also cuts the file to the pages in use."""
    return tuple(conn.execute(SQL_WAL_CHECKPOINT).fetchone())
