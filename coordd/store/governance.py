"""Schema step and SQL for governance of running work (issue 16): a lease's suspension.

A lease row carries what coordd.governance decided for its job: suspended since when and
why, since when its gates are open again, and whether it is being vacated. The state dies
with the lease (release, expiry, completion), so a job starts every run unsuspended.
Its own schema step: renumber it freely beside other branches' migrations.
"""

from __future__ import annotations

import sqlite3
from typing import Any

MIGRATION_GOVERNANCE = """
    ALTER TABLE leases ADD COLUMN suspended_at REAL;
    ALTER TABLE leases ADD COLUMN suspend_reason TEXT;
    ALTER TABLE leases ADD COLUMN gate_open_at REAL;
    ALTER TABLE leases ADD COLUMN vacate_reason TEXT
"""

SQL_WORKER_READINGS = "SELECT heartbeat_json FROM workers WHERE worker_id = ?"

_HELD = (
    "SELECT l.job_id, j.priority, j.gates_json, l.suspended_at, l.suspend_reason, "
    "l.gate_open_at, l.vacate_reason FROM leases l JOIN jobs j ON j.job_id = l.job_id "
)
SQL_HELD_BY_WORKER = _HELD + "WHERE l.worker_id = ? ORDER BY l.job_id"
SQL_HELD_ONE = _HELD + "WHERE l.worker_id = ? AND l.job_id = ?"

SQL_SET_GOVERNANCE = (
    "UPDATE leases SET suspended_at = ?, suspend_reason = ?, gate_open_at = ?, "
    "vacate_reason = ? WHERE job_id = ?"
)

SQL_LEASE_GOVERNANCE = (
    "SELECT suspended_at, suspend_reason, vacate_reason FROM leases WHERE job_id = ?"
)
SQL_GOVERNED_BY_WORKER = (
    "SELECT worker_id, job_id, suspended_at, suspend_reason, vacate_reason FROM leases "
    "WHERE suspended_at IS NOT NULL OR vacate_reason IS NOT NULL ORDER BY worker_id, job_id"
)


def lease_state(conn: sqlite3.Connection, job_id: str) -> tuple[Any, Any, Any]:
    """(suspended_at, suspend_reason, vacate_reason) of the job's lease (Nones if none)."""
    row = conn.execute(SQL_LEASE_GOVERNANCE, (job_id,)).fetchone()
    return (None, None, None) if row is None else tuple(row)


def governed(conn: sqlite3.Connection) -> dict[str, list[tuple[str, Any, Any, Any]]]:
    """worker_id -> [(job_id, suspended_at, suspend_reason, vacate_reason)] of the leases
    that are suspended or being vacated."""
    out: dict[str, list[tuple[str, Any, Any, Any]]] = {}
    for worker_id, job_id, at, reason, vacate in conn.execute(SQL_GOVERNED_BY_WORKER):
        out.setdefault(worker_id, []).append((job_id, at, reason, vacate))
    return out
