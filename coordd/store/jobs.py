"""A job's rows in the SQLite store: the insert (`enqueue`), `apply`, which writes each
job transition coordd.rules.transitions decides, the admin `cancel` and `retry`, the
reaper's end of lost leases, the event log (`job_events`), and the statements the claim
walk (coordd.store.sqlite.claims) and the fenced holder calls (coordd.store.sqlite.leases)
run on `jobs` and `leases`.

Functions here are synchronous and take an open `sqlite3.Connection` plus `now` (Unix
seconds from coordd's clock: no SQL reads the time itself). Write functions are only
called by `coordd.store.sqlite.writer.Writer`, inside its `BEGIN IMMEDIATE` transaction;
raising a `CoordError` rolls back that request alone (see the writer for how). Which
transition a job takes is decided in `coordd.rules.transitions` (pure); this module writes
the decision.
"""

from __future__ import annotations

import sqlite3

from coordd import errors
from coordd.rules import transitions as tr
from coordd.rules.transitions import Decision
from coordd.store import job_requests as _job_requests
from coordd.store import limits as _limits, resources as _resources_schema
from coordd.store.api import NewJob
from coordd.wire.protocol import EnqueueResult, StatusResult


# ---------------------------------------------------------------- events


SQL_EVENT = (
    "INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
# The same rows where a value is None, with NULL written in the statement: Python's sqlite3
# binds None through its adapter look-up (~3.5k instructions a value; str, int and float
# are bound directly). A complete's event has no reason, a lease most often no claim id.
SQL_EVENT_NO_REASON = (
    "INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    "VALUES (?, ?, ?, ?, ?, NULL)"
)


def event(conn: sqlite3.Connection, job_id: str, now: float, worker_id: str | None,
           from_status: str | None, to_status: str, reason: str | None) -> None:
    """Log an event; a status change's event comes with its coordd.rules.transitions row (a
    same-status note, e.g. a governance action, names the status twice)."""
    if reason is None:
        conn.execute(SQL_EVENT_NO_REASON, (job_id, now, worker_id, from_status, to_status))
    else:
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
        if artifact_sha256 is None:
            conn.execute(SQL_SUCCEED, (d.result_json, now, now, job_id))
        else:
            conn.execute(SQL_SUCCEED_ARTIFACT, (d.result_json, artifact_sha256, now, now, job_id))
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
    event(conn, job_id, now, worker_id, t.from_status, to, d.reason)


# ---------------------------------------------------------------- enqueue


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
# Candidate walks over the claim index: coordd.store.claim_index.
# The take, then its row read apart (SQL_TAKEN): an UPDATE with RETURNING gathers its rows
# in an ephemeral table it builds on every execution, which costs more than the read.
SQL_TAKE = (
    "UPDATE jobs SET status = 'running', attempts = attempts + 1, "
    "last_token = last_token + 1, updated_at = ? WHERE job_id = ? AND status = 'waiting'"
)
SQL_TAKEN = (
    "SELECT kind, required_role, priority, payload_json, attempts, checkpoint_json, "
    "max_runtime_s, last_token FROM jobs WHERE job_id = ?"
)
SQL_INSERT_LEASE = (
    "INSERT INTO leases (job_id, worker_id, token, claim_id, granted_at, expires_at, lease_s) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
SQL_INSERT_LEASE_NO_CLAIM_ID = (  # a claim without claim_id (NULL in the statement: above)
    "INSERT INTO leases (job_id, worker_id, token, claim_id, granted_at, expires_at, lease_s) "
    "VALUES (?, ?, ?, NULL, ?, ?, ?)"
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
SQL_SUCCEED = (  # no artifact (NULL in the statement: see SQL_EVENT_NO_REASON)
    "UPDATE jobs SET status = 'succeeded', result_json = ?, artifact_sha256 = NULL, "
    "updated_at = ?, finished_at = ?, last_error = NULL WHERE job_id = ?"
)
SQL_SUCCEED_ARTIFACT = (
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
