"""The schema and every SQL statement coordd runs, with row -> Struct conversion.

Functions here are synchronous and take an open `sqlite3.Connection` plus `now` (Unix
seconds from coordd's clock: no SQL reads the time itself). Write functions are only
called by `coordd.writer.Writer`, inside its `BEGIN IMMEDIATE` transaction and a
SAVEPOINT per request; raising a `CoordError` rolls back that request alone.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable
from typing import Any

import msgspec

from coordd import errors
from coordd.protocol import (
    JOB_STATUSES, ArtifactRef, ClaimedJob, ClaimResult, CompleteResult, EnqueueResult,
    EventView, JobView, LeaseGrant, LeaseView, RenewResult, StatusResult,
)

SCHEMA_VERSION = 1
CLAIM_SCAN = 16  # candidates looked at per priority level before giving up on that level

PRAGMAS_WRITER = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA foreign_keys=ON",
)
PRAGMAS_READER = ("PRAGMA foreign_keys=ON",)

MIGRATIONS: tuple[str, ...] = (
    # v1
    """
    CREATE TABLE workers (
        worker_id      TEXT PRIMARY KEY,
        roles_json     TEXT NOT NULL,
        heartbeat_json TEXT NOT NULL,
        heartbeat_at   REAL NOT NULL,
        first_seen_at  REAL NOT NULL
    );
    CREATE TABLE jobs (
        job_id           TEXT PRIMARY KEY,
        kind             TEXT NOT NULL,
        required_role    TEXT NOT NULL,
        priority         INTEGER NOT NULL CHECK (priority BETWEEN 0 AND 3),
        payload_json     TEXT NOT NULL,
        status           TEXT NOT NULL CHECK (status IN
                           ('waiting','running','succeeded','failed','cancelled')),
        attempts         INTEGER NOT NULL DEFAULT 0,
        max_attempts     INTEGER NOT NULL CHECK (max_attempts >= 1),
        run_at           REAL NOT NULL,
        queued_at        REAL NOT NULL,
        created_at       REAL NOT NULL,
        updated_at       REAL NOT NULL,
        finished_at      REAL,
        result_json      TEXT,
        artifact_sha256  TEXT REFERENCES artifacts(sha256),
        last_error       TEXT,
        checkpoint_json  TEXT,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        idempotency_key  TEXT UNIQUE,
        max_runtime_s    REAL,
        gates_json       TEXT,
        last_token       INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_claim ON jobs (priority, queued_at) WHERE status = 'waiting';
    CREATE INDEX jobs_status ON jobs (status, updated_at);
    CREATE TABLE leases (
        job_id     TEXT PRIMARY KEY REFERENCES jobs(job_id) ON DELETE CASCADE,
        worker_id  TEXT NOT NULL,
        token      INTEGER NOT NULL,
        claim_id   TEXT,
        granted_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        lease_s    REAL NOT NULL
    );
    CREATE INDEX leases_expiry ON leases (expires_at);
    CREATE INDEX leases_worker ON leases (worker_id);
    CREATE UNIQUE INDEX leases_claim_id ON leases (worker_id, claim_id)
        WHERE claim_id IS NOT NULL;
    CREATE TABLE job_events (
        event_id    INTEGER PRIMARY KEY,
        job_id      TEXT NOT NULL,
        at          REAL NOT NULL,
        worker_id   TEXT,
        from_status TEXT,
        to_status   TEXT NOT NULL,
        reason      TEXT
    );
    CREATE INDEX job_events_job ON job_events (job_id, event_id);
    CREATE TABLE artifacts (
        sha256     TEXT PRIMARY KEY,
        path       TEXT NOT NULL,
        size       INTEGER NOT NULL,
        created_at REAL NOT NULL
    );
    """,
)

_json_encode = msgspec.json.encode
_json_decode = msgspec.json.decode


def dumps(value: Any) -> str:
    """Encode a JSON-compatible value as compact JSON text."""
    return _json_encode(value).decode()


# ---------------------------------------------------------------- schema


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema to SCHEMA_VERSION (keyed on PRAGMA user_version); return it.

    Raises:
        errors.StoreError: the file is from a newer coordd, or is not a coordd database.
    """
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise errors.StoreError(
            f"database schema v{version} is newer than this coordd (v{SCHEMA_VERSION})")
    if version == 0:
        tables = conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
        if tables:
            raise errors.StoreError("database has tables but no coordd schema version")
    for v in range(version, SCHEMA_VERSION):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in _split(MIGRATIONS[v]):
                conn.execute(stmt)
            conn.execute(f"PRAGMA user_version = {v + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return SCHEMA_VERSION


def _split(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


# ---------------------------------------------------------------- events


SQL_EVENT = (
    "INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)


def _event(conn: sqlite3.Connection, job_id: str, now: float, worker_id: str | None,
           from_status: str | None, to_status: str, reason: str | None) -> None:
    conn.execute(SQL_EVENT, (job_id, now, worker_id, from_status, to_status, reason))


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


def heartbeat(conn: sqlite3.Connection, now: float, worker_id: str, roles: list[str],
              readings_json: str) -> list[str]:
    """Record a heartbeat (coordd's clock); return job ids this worker holds whose cancel was requested."""
    conn.execute(SQL_HEARTBEAT, (worker_id, dumps(sorted(set(roles))), readings_json, now, now))
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


SQL_ENQUEUE = (
    "INSERT INTO jobs (job_id, kind, required_role, priority, payload_json, status, "
    "max_attempts, run_at, queued_at, created_at, updated_at, idempotency_key, "
    "max_runtime_s, gates_json) VALUES (?, ?, ?, ?, ?, 'waiting', ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (idempotency_key) DO NOTHING RETURNING job_id"
)
SQL_JOB_BY_KEY = "SELECT job_id FROM jobs WHERE idempotency_key = ?"


def enqueue(conn: sqlite3.Connection, now: float, job: NewJob) -> EnqueueResult:
    """Insert a waiting job; a repeated idempotency key returns the existing job (created=False)."""
    row = conn.execute(SQL_ENQUEUE, (
        job.job_id, job.kind, job.required_role, job.priority, job.payload_json,
        job.max_attempts, job.run_at if job.run_at is not None else now, now, now, now,
        job.idempotency_key, job.max_runtime_s, job.gates_json,
    )).fetchone()
    if row is None:
        existing = conn.execute(SQL_JOB_BY_KEY, (job.idempotency_key,)).fetchone()
        return EnqueueResult(job_id=existing[0], created=False)
    _event(conn, job.job_id, now, None, None, "waiting", "enqueued")
    return EnqueueResult(job_id=job.job_id, created=True)


# ---------------------------------------------------------------- claim


SQL_WORKER = "SELECT roles_json, heartbeat_json, heartbeat_at FROM workers WHERE worker_id = ?"
SQL_LEASE_BY_CLAIM_ID = (
    "SELECT job_id, token, expires_at, lease_s FROM leases "
    "WHERE worker_id = ? AND claim_id = ? AND expires_at > ?"
)
SQL_CANDIDATES = (
    "SELECT job_id, queued_at, gates_json FROM jobs INDEXED BY jobs_claim "
    "WHERE status = 'waiting' AND priority = ? AND run_at <= ? "
    "AND required_role IN (SELECT value FROM json_each(?)) "
    "ORDER BY queued_at, rowid LIMIT ?"
)
SQL_ANY_RUNNABLE = "SELECT 1 FROM jobs WHERE status = 'waiting' AND run_at <= ? LIMIT 1"
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
SQL_DEAD_LETTER_DECODE = (
    "UPDATE jobs SET status = 'failed', updated_at = ?, finished_at = ?, last_error = ? "
    "WHERE job_id = ?"
)


class ClaimPolicy(msgspec.Struct, kw_only=True):
    """What claim needs from the config: gate policies per priority and timing knobs."""

    policies: dict[int, Any]  # priority -> coordd.gates.GatePolicy
    heartbeat_stale_s: float
    aging_interval_s: float


def effective_priority(priority: int, queued_at: float, now: float, aging_s: float) -> int:
    """Priority after aging: one step better per `aging_s` seconds waited, never above P0."""
    if aging_s <= 0:
        return priority
    return max(0, priority - int(max(0.0, now - queued_at) // aging_s))


def claim(conn: sqlite3.Connection, now: float, worker_id: str, lease_s: float,
          claim_id: str | None, policy: ClaimPolicy) -> ClaimResult:
    """Hand the best runnable job to `worker_id` under a new lease (see `_claim_once`).

    Jobs whose stored payload does not decode are dead-lettered on the way and skipped.
    """
    while True:
        result = _claim_once(conn, now, worker_id, lease_s, claim_id, policy)
        if result is not None:
            return result


def _claim_once(conn: sqlite3.Connection, now: float, worker_id: str, lease_s: float,
                claim_id: str | None, policy: ClaimPolicy) -> ClaimResult | None:
    """Try once to hand out a job; None when the pick was dead-lettered (undecodable payload).

    Order: lowest effective priority first, then longest queued. A job is a candidate
    when it is waiting, its `run_at` has come, the worker holds its role, and the gates of
    the job's own priority (merged with the job's overrides) pass on the worker's last
    readings. A payload that does not decode sends its job to the dead letter state
    (`payload_decode_error`) and the search goes on.

    Returns a ClaimResult; with no job, `reasons` holds refusal codes (`heartbeat_stale`,
    `no_matching_role`, gate codes), empty when nothing is runnable at all.
    """
    from coordd import gates  # local: gates imports nothing of ours, keeps the cycle out

    if claim_id is not None:
        row = conn.execute(SQL_LEASE_BY_CLAIM_ID, (worker_id, claim_id, now)).fetchone()
        if row is not None:
            return _claimed(conn, row[0], LeaseGrant(token=row[1], expires_at=row[2],
                                                     lease_s=row[3]))
    worker = conn.execute(SQL_WORKER, (worker_id,)).fetchone()
    if worker is None:
        return ClaimResult(reasons=[gates.HEARTBEAT_STALE],
                           detail=f"worker {worker_id} never sent a heartbeat")
    age = now - worker[2]
    if age > policy.heartbeat_stale_s:
        return ClaimResult(reasons=[gates.HEARTBEAT_STALE],
                           detail=f"last heartbeat {age:.1f}s ago > {policy.heartbeat_stale_s:g}s")
    roles_json, readings = worker[0], _json_decode(worker[1])
    reasons: dict[str, str] = {}
    best: tuple[int, float, str] | None = None
    for prio in (0, 1, 2, 3):
        if best is not None and best[0] <= prio:
            break  # nothing at this level or later can beat the best found (aging only improves)
        base = policy.policies[prio]
        base_refusals = gates.evaluate(base, readings)
        for job_id, queued_at, gates_json in conn.execute(
                SQL_CANDIDATES, (prio, now, roles_json, CLAIM_SCAN)):
            refusals = base_refusals
            if gates_json is not None:
                try:
                    refusals = gates.evaluate(gates.merge(base, _json_decode(gates_json)),
                                              readings)
                except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                    refusals = [("bad_gates", f"job {job_id}: stored gates invalid: {exc}")]
            if refusals:
                for code, detail in refusals:
                    reasons.setdefault(code, detail)
                continue
            eff = effective_priority(prio, queued_at, now, policy.aging_interval_s)
            if best is None or (eff, queued_at) < (best[0], best[1]):
                best = (eff, queued_at, job_id)
            break
    if best is None:
        if not reasons and conn.execute(SQL_ANY_RUNNABLE, (now,)).fetchone() is not None:
            reasons[gates.NO_MATCHING_ROLE] = "no runnable job needs one of this worker's roles"
        return ClaimResult(reasons=list(reasons), detail="; ".join(reasons.values()))
    job_id = best[2]
    row = conn.execute(SQL_TAKE, (now, job_id)).fetchone()
    kind, role, prio, payload_json, attempts, checkpoint_json, max_runtime_s, token = row
    try:
        payload = _json_decode(payload_json)
    except msgspec.DecodeError as exc:
        error = f"{gates.PAYLOAD_DECODE_ERROR}: {exc}"
        conn.execute(SQL_DEAD_LETTER_DECODE, (now, now, error, job_id))
        _event(conn, job_id, now, worker_id, "waiting", "failed", gates.PAYLOAD_DECODE_ERROR)
        return None  # the claim goes on to the next candidate
    conn.execute(SQL_INSERT_LEASE, (job_id, worker_id, token, claim_id, now, now + lease_s,
                                    lease_s))
    _event(conn, job_id, now, worker_id, "waiting", "running", f"claimed (token {token})")
    return ClaimResult(
        job=ClaimedJob(job_id=job_id, kind=kind, required_role=role, priority=prio,
                       payload=payload, attempts=attempts,
                       checkpoint=_maybe_json(checkpoint_json), max_runtime_s=max_runtime_s),
        lease=LeaseGrant(token=token, expires_at=now + lease_s, lease_s=lease_s),
    )


def _claimed(conn: sqlite3.Connection, job_id: str, lease: LeaseGrant) -> ClaimResult:
    row = conn.execute(SQL_CLAIMED_JOB, (job_id,)).fetchone()
    return ClaimResult(
        job=ClaimedJob(job_id=job_id, kind=row[0], required_role=row[1], priority=row[2],
                       payload=_json_decode(row[3]), attempts=row[4],
                       checkpoint=_maybe_json(row[5]), max_runtime_s=row[6]),
        lease=lease,
    )


def _maybe_json(text: str | None) -> Any:
    return None if text is None else _json_decode(text)


# ---------------------------------------------------------------- lease holder calls


SQL_JOB_FOR_LEASE = (
    "SELECT j.status, j.cancel_requested, j.max_runtime_s, j.attempts, j.max_attempts, "
    "l.worker_id, l.token, l.granted_at, l.expires_at FROM jobs j "
    "LEFT JOIN leases l ON l.job_id = j.job_id WHERE j.job_id = ?"
)
SQL_RENEW = "UPDATE leases SET expires_at = ?, lease_s = ? WHERE job_id = ?"
SQL_CHECKPOINT = "UPDATE jobs SET checkpoint_json = ?, updated_at = ? WHERE job_id = ?"
SQL_DELETE_LEASE = "DELETE FROM leases WHERE job_id = ?"
SQL_SUCCEED = (
    "UPDATE jobs SET status = 'succeeded', result_json = ?, artifact_sha256 = ?, "
    "updated_at = ?, finished_at = ? WHERE job_id = ?"
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


class _Held(msgspec.Struct):
    status: str
    cancel_requested: bool
    max_runtime_s: float | None
    attempts: int
    max_attempts: int
    granted_at: float


def _check_lease(conn: sqlite3.Connection, now: float, job_id: str, worker_id: str,
                 token: int) -> _Held:
    """Fence a lease-holder call: the lease must be the job's current one and unexpired.

    Raises:
        errors.NotFound: no such job.
        errors.AlreadyCompleted: the job already succeeded (the first result stands).
        errors.LeaseLost: the presented lease is not the job's current lease.
        errors.LeaseExpired: it is, but `now >= expires_at` (whether or not reaped yet).
    """
    row = conn.execute(SQL_JOB_FOR_LEASE, (job_id,)).fetchone()
    if row is None:
        raise errors.NotFound(f"job {job_id} not found")
    status, cancel, max_runtime_s, attempts, max_attempts, l_worker, l_token, granted, expires = row
    if l_worker != worker_id or l_token != token:
        if status == "succeeded":
            raise errors.AlreadyCompleted(f"job {job_id} already succeeded")
        raise errors.LeaseLost(f"job {job_id}: lease token {token} of {worker_id} is not current "
                               f"(job is {status})")
    if now >= expires:
        raise errors.LeaseExpired(f"job {job_id}: lease expired at {expires:.3f} (now {now:.3f})")
    return _Held(status, bool(cancel), max_runtime_s, attempts, max_attempts, granted)


def renew(conn: sqlite3.Connection, now: float, job_id: str, worker_id: str, token: int,
          lease_s: float) -> RenewResult:
    """Extend the caller's lease to `now + lease_s`.

    Raises:
        errors.LeaseLost: as `_check_lease`, or the job ran past its `max_runtime_s`.
        errors.LeaseExpired, errors.NotFound, errors.AlreadyCompleted: as `_check_lease`.
    """
    held = _check_lease(conn, now, job_id, worker_id, token)
    if held.max_runtime_s is not None and now > held.granted_at + held.max_runtime_s:
        raise errors.LeaseLost(f"job {job_id}: max runtime {held.max_runtime_s:g}s exceeded")
    conn.execute(SQL_RENEW, (now + lease_s, lease_s, job_id))
    return RenewResult(expires_at=now + lease_s, lease_s=lease_s,
                       cancel_requested=held.cancel_requested)


def checkpoint(conn: sqlite3.Connection, now: float, job_id: str, worker_id: str, token: int,
               checkpoint_json: str) -> None:
    """Store the job's latest checkpoint (fenced like `renew`)."""
    _check_lease(conn, now, job_id, worker_id, token)
    conn.execute(SQL_CHECKPOINT, (checkpoint_json, now, job_id))


def complete(conn: sqlite3.Connection, now: float, job_id: str, worker_id: str, token: int,
             result_json: str | None, artifact: ArtifactRef | None) -> CompleteResult:
    """Store the result and end the job `succeeded`; a job whose cancel was requested ends
    `cancelled` instead and the result is dropped. Fenced like `renew`."""
    held = _check_lease(conn, now, job_id, worker_id, token)
    conn.execute(SQL_DELETE_LEASE, (job_id,))
    if held.cancel_requested:
        conn.execute(SQL_TO_TERMINAL, ("cancelled", "cancelled before completion", now, now,
                                       job_id))
        _event(conn, job_id, now, worker_id, "running", "cancelled", "cancel requested; result dropped")
        return CompleteResult(status="cancelled")
    if artifact is not None:
        conn.execute(SQL_INSERT_ARTIFACT, (artifact.sha256, artifact.path, artifact.size, now))
    conn.execute(SQL_SUCCEED, (result_json, artifact.sha256 if artifact else None, now, now,
                               job_id))
    _event(conn, job_id, now, worker_id, "running", "succeeded", None)
    return CompleteResult(status="succeeded")


def fail(conn: sqlite3.Connection, now: float, job_id: str, worker_id: str, token: int,
         error: str, retryable: bool, backoff: Callable[[int], float]) -> StatusResult:
    """Record a failure: back to waiting after `backoff(attempts)` seconds if retryable and
    attempts remain, else `failed` (dead letter); `cancelled` if a cancel was requested."""
    held = _check_lease(conn, now, job_id, worker_id, token)
    conn.execute(SQL_DELETE_LEASE, (job_id,))
    if held.cancel_requested:
        conn.execute(SQL_TO_TERMINAL, ("cancelled", error, now, now, job_id))
        _event(conn, job_id, now, worker_id, "running", "cancelled", error)
        return StatusResult(status="cancelled")
    if not retryable or held.attempts >= held.max_attempts:
        why = (f"permanent: {error}" if not retryable
               else f"attempts exhausted (last: {error})")
        conn.execute(SQL_TO_TERMINAL, ("failed", why, now, now, job_id))
        _event(conn, job_id, now, worker_id, "running", "failed", why)
        return StatusResult(status="failed")
    run_at = now + backoff(held.attempts)
    conn.execute(SQL_TO_WAITING, (error, run_at, now, now, job_id))
    _event(conn, job_id, now, worker_id, "running", "waiting",
           f"retryable: {error}; backoff until {run_at:.3f}")
    return StatusResult(status="waiting", run_at=run_at)


# ---------------------------------------------------------------- admin transitions


SQL_JOB_STATUS = "SELECT status FROM jobs WHERE job_id = ?"
SQL_REQUEST_CANCEL = "UPDATE jobs SET cancel_requested = 1, updated_at = ? WHERE job_id = ?"
SQL_RETRY = (
    "UPDATE jobs SET status = 'waiting', attempts = 0, run_at = ?, queued_at = ?, "
    "updated_at = ?, finished_at = NULL, cancel_requested = 0 WHERE job_id = ?"
)


def _status(conn: sqlite3.Connection, job_id: str) -> str:
    row = conn.execute(SQL_JOB_STATUS, (job_id,)).fetchone()
    if row is None:
        raise errors.NotFound(f"job {job_id} not found")
    return row[0]


def cancel(conn: sqlite3.Connection, now: float, job_id: str) -> StatusResult:
    """Cancel: waiting -> cancelled at once; running -> cancel requested (the holder learns it
    from `renew`/`heartbeat` and ends it); cancelled stays cancelled.

    Raises:
        errors.NotFound: no such job.
        errors.InvalidState: the job already succeeded or failed.
    """
    status = _status(conn, job_id)
    if status == "waiting":
        conn.execute(SQL_TO_TERMINAL, ("cancelled", None, now, now, job_id))
        _event(conn, job_id, now, None, "waiting", "cancelled", "cancelled by admin")
        return StatusResult(status="cancelled")
    if status == "running":
        conn.execute(SQL_REQUEST_CANCEL, (now, job_id))
        _event(conn, job_id, now, None, "running", "running", "cancel requested")
        return StatusResult(status="running")
    if status == "cancelled":
        return StatusResult(status="cancelled")
    raise errors.InvalidState(f"job {job_id} is {status}; only waiting or running jobs cancel")


def retry(conn: sqlite3.Connection, now: float, job_id: str) -> StatusResult:
    """Put a failed (dead-lettered) or cancelled job back to waiting with a fresh attempt budget.

    Raises:
        errors.NotFound: no such job.
        errors.InvalidState: the job is waiting, running or succeeded.
    """
    status = _status(conn, job_id)
    if status not in ("failed", "cancelled"):
        raise errors.InvalidState(f"job {job_id} is {status}; only failed or cancelled jobs retry")
    conn.execute(SQL_RETRY, (now, now, now, job_id))
    _event(conn, job_id, now, None, status, "waiting", "retried by admin")
    return StatusResult(status="waiting", run_at=now)


# ---------------------------------------------------------------- reaper, clock jumps


SQL_EXPIRED = (
    "SELECT l.job_id, l.worker_id, j.attempts, j.max_attempts, j.cancel_requested "
    "FROM leases l JOIN jobs j ON j.job_id = l.job_id WHERE l.expires_at <= ? "
    "ORDER BY l.expires_at LIMIT ?"
)
SQL_EXTEND_LEASES = "UPDATE leases SET expires_at = expires_at + ?, granted_at = granted_at + ?"


def reap_expired(conn: sqlite3.Connection, now: float, limit: int = 1000) -> int:
    """Return jobs whose lease has expired (`expires_at <= now`) to waiting, at the back of
    their priority (queued_at = now, so a job that keeps hanging cannot monopolize the
    head of the queue), or to `failed` once attempts are spent, or `cancelled` if a
    cancel was requested. The expired attempt counts (it was counted at claim)."""
    rows = conn.execute(SQL_EXPIRED, (now, limit)).fetchall()
    for job_id, worker_id, attempts, max_attempts, cancel_requested in rows:
        conn.execute(SQL_DELETE_LEASE, (job_id,))
        if cancel_requested:
            conn.execute(SQL_TO_TERMINAL, ("cancelled", "lease_expired after cancel", now, now,
                                           job_id))
            _event(conn, job_id, now, worker_id, "running", "cancelled", "lease_expired")
        elif attempts >= max_attempts:
            why = "attempts exhausted (last: lease_expired)"
            conn.execute(SQL_TO_TERMINAL, ("failed", why, now, now, job_id))
            _event(conn, job_id, now, worker_id, "running", "failed", why)
        else:
            why = f"lease_expired (worker {worker_id} lost)"
            conn.execute(SQL_TO_WAITING, (why, now, now, now, job_id))
            _event(conn, job_id, now, worker_id, "running", "waiting", "lease_expired")
    return len(rows)


def extend_leases(conn: sqlite3.Connection, seconds: float) -> int:
    """Shift every live lease (expiry and grant time) later by `seconds`; return how many.

    Used when coordd sees its wall clock jump far past its monotonic clock (a suspend and
    resume): the holders were frozen too, so the time they lost is given back.
    """
    return conn.execute(SQL_EXTEND_LEASES, (seconds, seconds)).rowcount


# ---------------------------------------------------------------- reads


SQL_COUNT_BY_STATUS = "SELECT status, count(*) FROM jobs GROUP BY status"
SQL_WAITING_BY_PRIORITY = (
    "SELECT priority, count(*), min(queued_at) FROM jobs WHERE status = 'waiting' "
    "GROUP BY priority"
)
SQL_COUNT_WORKERS = "SELECT count(*), coalesce(sum(heartbeat_at >= ?), 0) FROM workers"
SQL_COUNT_LEASES = "SELECT count(*) FROM leases"
SQL_JOB_ROW = (
    "SELECT j.job_id, j.kind, j.required_role, j.priority, j.status, j.attempts, "
    "j.max_attempts, j.run_at, j.queued_at, j.created_at, j.updated_at, j.finished_at, "
    "j.payload_json, j.result_json, j.last_error, j.checkpoint_json, j.cancel_requested, "
    "j.idempotency_key, j.max_runtime_s, j.gates_json, "
    "a.sha256, a.size, a.path, "
    "l.worker_id, l.token, l.granted_at, l.expires_at, l.lease_s "
    "FROM jobs j LEFT JOIN leases l ON l.job_id = j.job_id "
    "LEFT JOIN artifacts a ON a.sha256 = j.artifact_sha256 "
)
SQL_GET_JOB = SQL_JOB_ROW + "WHERE j.job_id = ?"
SQL_LIST_JOBS = (
    SQL_JOB_ROW + "WHERE (?1 IS NULL OR j.status = ?1) AND (?2 IS NULL OR j.kind = ?2) "
    "AND (?3 IS NULL OR j.required_role = ?3) AND (?4 IS NULL OR j.priority = ?4) "
    "AND j.rowid > coalesce((SELECT rowid FROM jobs WHERE job_id = ?5), 0) "
    "ORDER BY j.rowid LIMIT ?6"
)
SQL_EVENTS = (
    "SELECT at, from_status, to_status, worker_id, reason FROM job_events "
    "WHERE job_id = ? ORDER BY event_id"
)
SQL_WORKERS = (
    "SELECT w.worker_id, w.roles_json, w.heartbeat_json, w.heartbeat_at, "
    "(SELECT count(*) FROM leases l WHERE l.worker_id = w.worker_id) "
    "FROM workers w ORDER BY w.worker_id"
)


def status_counts(conn: sqlite3.Connection, now: float, stale_s: float
                  ) -> tuple[int, int, int, dict[str, int], dict[str, int], float | None]:
    """Return (workers, workers_live, active_leases, jobs by status (every status present),
    waiting by priority "p0".."p3", age in seconds of the longest-waiting job or None)."""
    jobs = dict.fromkeys(JOB_STATUSES, 0)
    jobs.update({s: n for s, n in conn.execute(SQL_COUNT_BY_STATUS)})
    waiting = {f"p{p}": 0 for p in range(4)}
    oldest: float | None = None
    for prio, n, min_queued in conn.execute(SQL_WAITING_BY_PRIORITY):
        waiting[f"p{prio}"] = n
        oldest = min_queued if oldest is None else min(oldest, min_queued)
    workers, live = conn.execute(SQL_COUNT_WORKERS, (now - stale_s,)).fetchone()
    leases = conn.execute(SQL_COUNT_LEASES).fetchone()[0]
    return workers, live, leases, jobs, waiting, (None if oldest is None else now - oldest)


def _job_view(row: sqlite3.Row | tuple, now: float, aging_s: float,
              events: list[EventView] | None = None) -> JobView:
    (job_id, kind, role, prio, status, attempts, max_attempts, run_at, queued_at, created_at,
     updated_at, finished_at, payload_json, result_json, last_error, checkpoint_json, cancel,
     key, max_runtime_s, _gates, a_sha, a_size, a_path, l_worker, l_token, l_granted,
     l_expires, l_lease_s) = row
    try:
        payload = _json_decode(payload_json)
    except msgspec.DecodeError:
        payload = {"undecodable_payload": payload_json[:200]}
    return JobView(
        job_id=job_id, kind=kind, required_role=role, priority=prio,
        effective_priority=(effective_priority(prio, queued_at, now, aging_s)
                            if status == "waiting" else prio),
        status=status, attempts=attempts, max_attempts=max_attempts, run_at=run_at,
        created_at=created_at, updated_at=updated_at, age_s=max(0.0, now - created_at),
        payload=payload, result=_maybe_json(result_json),
        artifact=ArtifactRef(sha256=a_sha, size=a_size, path=a_path) if a_sha else None,
        last_error=last_error, checkpoint=_maybe_json(checkpoint_json),
        cancel_requested=bool(cancel), idempotency_key=key, max_runtime_s=max_runtime_s,
        finished_at=finished_at,
        lease=(LeaseView(worker_id=l_worker, token=l_token, granted_at=l_granted,
                         expires_at=l_expires, lease_s=l_lease_s) if l_worker else None),
        events=events or [],
    )


def get_job(conn: sqlite3.Connection, now: float, job_id: str, aging_s: float) -> JobView:
    """Return one job with its lease and event log.

    Raises:
        errors.NotFound: no such job.
    """
    row = conn.execute(SQL_GET_JOB, (job_id,)).fetchone()
    if row is None:
        raise errors.NotFound(f"job {job_id} not found")
    events = [EventView(at=r[0], from_status=r[1], to_status=r[2], worker_id=r[3], reason=r[4])
              for r in conn.execute(SQL_EVENTS, (job_id,))]
    return _job_view(row, now, aging_s, events)


def job_gates(conn: sqlite3.Connection, job_id: str) -> dict[str, Any] | None:
    """Return a job's own gate overrides, or None."""
    row = conn.execute("SELECT gates_json FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
    return _maybe_json(row[0]) if row else None


def list_jobs(conn: sqlite3.Connection, now: float, *, status: str | None, kind: str | None,
              role: str | None, priority: int | None, limit: int, after: str | None,
              aging_s: float) -> list[JobView]:
    """Return up to `limit` jobs matching every given filter, in enqueue order after `after`."""
    rows = conn.execute(SQL_LIST_JOBS, (status, kind, role, priority, after, limit)).fetchall()
    return [_job_view(r, now, aging_s) for r in rows]


def list_workers(conn: sqlite3.Connection) -> list[tuple[str, list[str], dict[str, Any], float, int]]:
    """Return (worker_id, roles, readings, heartbeat_at, active_leases) for every worker."""
    out = []
    for worker_id, roles_json, hb_json, hb_at, n in conn.execute(SQL_WORKERS):
        try:
            readings = _json_decode(hb_json)
        except msgspec.DecodeError:
            readings = {}
        out.append((worker_id, _json_decode(roles_json), readings, hb_at, n))
    return out


def backoff_delay(attempts: int, base_s: float, cap_s: float, jitter: float, u: float) -> float:
    """Retry delay in seconds: min(cap, base * 2**(attempts-1)) * (1 + u * jitter), u in [0, 1).

    The jitter only adds, so a retry never comes sooner than the un-jittered delay.
    """
    exp = min(cap_s, base_s * math.pow(2.0, max(0, attempts - 1)))
    return exp * (1.0 + u * jitter)
