"""Schema step and SQL for governance of running work (issue 16): a lease's suspension.

A lease row carries what coordd.rules.governance decided for its job: suspended since when and
why, since when its gates are open again, and whether it is being vacated. The state dies
with the lease (release, expiry, completion), so a job starts every run unsuspended.
Its own schema step: renumber it freely beside other branches' migrations.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from coordd.wire.governance import Suspension

MIGRATION_GOVERNANCE = """
    ALTER TABLE leases ADD COLUMN suspended_at REAL;
    ALTER TABLE leases ADD COLUMN suspend_reason TEXT;
    ALTER TABLE leases ADD COLUMN gate_open_at REAL;
    ALTER TABLE leases ADD COLUMN vacate_reason TEXT
"""
MIGRATION_RESUME_AT = "ALTER TABLE leases ADD COLUMN resume_at REAL"  # gates open: resumes then

SQL_WORKER_READINGS = "SELECT heartbeat_json FROM workers WHERE worker_id = ?"

_HELD = (
    "SELECT l.job_id, j.priority, j.gates_json, l.suspended_at, l.suspend_reason, "
    "l.gate_open_at, l.vacate_reason, l.resume_at "
    "FROM leases l JOIN jobs j ON j.job_id = l.job_id "
)
SQL_HELD_BY_WORKER = _HELD + "WHERE l.worker_id = ? ORDER BY l.job_id"
SQL_HELD_ONE = _HELD + "WHERE l.worker_id = ? AND l.job_id = ?"

# Quiet heartbeats' times, stored in one batch (coordd.service.beats): ?1 now, ?2 age, ?3 id.
SQL_TOUCH_WORKER = (  # ?4: the latest readings' JSON, or NULL to keep the stored ones
    "UPDATE workers SET heartbeat_at = max(heartbeat_at, ?1 - ?2), "
    "heartbeat_json = coalesce(?4, heartbeat_json) WHERE worker_id = ?3"
)
# The restart grace's liveness part: ?1 now, ?2 bound_s, ?3 stale_s.
SQL_LIVENESS_GRACE = (
    "UPDATE workers SET heartbeat_at = min(?1, heartbeat_at + ?2) WHERE offline_at IS NULL "
    "AND heartbeat_at < ?1 AND heartbeat_at > ?1 - ?3 - ?2"
)

SQL_SET_GOVERNANCE = (
    "UPDATE leases SET suspended_at = ?, suspend_reason = ?, gate_open_at = ?, "
    "vacate_reason = ?, resume_at = ? WHERE job_id = ?"
)

SQL_LEASE_GOVERNANCE = (
    "SELECT suspended_at, suspend_reason, vacate_reason, resume_at FROM leases WHERE job_id = ?"
)
SQL_GOVERNED_BY_WORKER = (
    "SELECT worker_id, job_id, suspended_at, suspend_reason, vacate_reason, resume_at "
    "FROM leases WHERE suspended_at IS NOT NULL OR vacate_reason IS NOT NULL "
    "ORDER BY worker_id, job_id"
)


def lease_state(conn: sqlite3.Connection, job_id: str) -> Suspension | None:
    """The job's lease suspension or vacate state; None when running normally (or no lease)."""
    row = conn.execute(SQL_LEASE_GOVERNANCE, (job_id,)).fetchone()
    if row is None or (row[0] is None and row[2] is None):
        return None
    return Suspension(suspended_at=row[0], suspend_reason=row[1], vacate_reason=row[2],
                      resume_at=row[3])


def governed(conn: sqlite3.Connection) -> dict[str, list[tuple[Any, ...]]]:
    """worker_id -> [(job_id, suspended_at, suspend_reason, vacate_reason, resume_at)] of
    the leases that are suspended or being vacated."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for worker_id, *row in conn.execute(SQL_GOVERNED_BY_WORKER):
        out.setdefault(worker_id, []).append(tuple(row))
    return out


# ---------------------------------------------------------------- preemption (v9 too)

MIGRATION_RESERVATIONS = """
    CREATE TABLE reservations (
        job_id        TEXT PRIMARY KEY REFERENCES jobs(job_id) ON DELETE CASCADE,
        worker_id     TEXT NOT NULL,
        victim_job_id TEXT NOT NULL,
        created_at    REAL NOT NULL,
        expires_at    REAL NOT NULL
    );
    CREATE INDEX reservations_worker ON reservations (worker_id, expires_at)
"""

SQL_DELETE_LAPSED_RESERVATIONS = "DELETE FROM reservations WHERE expires_at <= ?"
SQL_ANY_PREEMPTOR = (  # from the counters (coordd.store.counters): no job row read
    "SELECT 1 FROM job_counts WHERE status = 'waiting' AND priority <= ? AND n > 0 LIMIT 1"
)
SQL_PREEMPTING_CANDIDATES = (  # waiting jobs that may preempt, best first, none reserved yet
    "SELECT j.job_id, j.kind, j.required_role, j.priority, j.gates_json "
    "FROM jobs j WHERE j.status = 'waiting' AND j.priority <= ? "
    "AND j.run_at <= ? AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.job_id = j.job_id) "
    "ORDER BY j.priority, j.queued_at, j.job_id LIMIT ?"
)
SQL_LIVE_WORKERS = (
    "SELECT worker_id, roles_json, heartbeat_json, kinds_json FROM workers "
    "WHERE heartbeat_at >= ? AND offline_at IS NULL ORDER BY worker_id"
)
SQL_ALL_HELD = (
    "SELECT l.worker_id, l.job_id, j.kind, j.priority, l.granted_at, "
    "CASE WHEN j.checkpoint_json IS NOT NULL AND j.updated_at > l.granted_at "
    "THEN j.updated_at ELSE l.granted_at END, l.vacate_reason "
    "FROM leases l JOIN jobs j ON j.job_id = l.job_id"
)
SQL_RESERVATIONS = (  # those still promised: their job waits
    "SELECT r.worker_id, r.job_id FROM reservations r JOIN jobs j ON j.job_id = r.job_id "
    "WHERE j.status = 'waiting'"
)
SQL_INSERT_RESERVATION = (
    "INSERT INTO reservations (job_id, worker_id, victim_job_id, created_at, expires_at) "
    "VALUES (?, ?, ?, ?, ?)"
)
SQL_MARK_VACATE = "UPDATE leases SET vacate_reason = ? WHERE job_id = ? AND vacate_reason IS NULL"
SQL_RESERVED_FOR_WORKER = (  # the claim's look: is this worker's freed capacity promised?
    "SELECT r.job_id, j.status, j.kind FROM reservations r JOIN jobs j ON j.job_id = r.job_id "
    "WHERE r.worker_id = ? AND r.expires_at > ? ORDER BY r.created_at"
)
SQL_DELETE_RESERVATION = "DELETE FROM reservations WHERE job_id = ?"
SQL_ANY_RESERVATION = "SELECT 1 FROM reservations LIMIT 1"  # lapsed ones count too
SQL_RESERVATION_OF = (
    "SELECT r.worker_id, r.victim_job_id, j.priority, r.expires_at FROM reservations r "
    "JOIN jobs j ON j.job_id = r.victim_job_id WHERE r.job_id = ?"
)


def reservation_of(conn: sqlite3.Connection, job_id: str) -> tuple[Any, ...] | None:
    """(worker_id, victim job id, victim priority, expires_at) of a waiting job's
    reservation, or None."""
    row = conn.execute(SQL_RESERVATION_OF, (job_id,)).fetchone()
    return None if row is None else tuple(row)
