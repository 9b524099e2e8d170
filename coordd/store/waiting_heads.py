"""SQL and SQLite's read of the oldest due waiting jobs of a priority (`status`'s waiting list,
coordd.service.waiting_report), walked over the claim index (coordd.store.claim_index): one seek
per waiting role, per kind of it, and per (role, kind, level), whatever the queue's size.
"""

from __future__ import annotations

import sqlite3

from coordd.store import views
from coordd.wire.protocol import JobView
from coordd.store.claim_index import SQL_ROLE_KINDS
from coordd.store.reads import SQL_GET_JOB

# The roles of the waiting jobs, one index seek each (a skip-scan).
SQL_WAITING_ROLES = (
    "WITH RECURSIVE r(role) AS ("
    "SELECT min(required_role) FROM jobs INDEXED BY jobs_claim WHERE status = 'waiting' "
    "UNION ALL SELECT (SELECT min(required_role) FROM jobs INDEXED BY jobs_claim "
    "WHERE status = 'waiting' AND required_role > r.role) FROM r WHERE r.role IS NOT NULL) "
    "SELECT role FROM r WHERE role IS NOT NULL"
)
SQL_WAITING_ROLE_KINDS = SQL_ROLE_KINDS  # ?1 role
# The oldest due jobs of (role ?1, kind ?2) at level ?3 (due at ?4), ?5 of them:
# (job_id, ready time: when it became runnable).
SQL_PAIR_OLDEST_DUE = (
    "SELECT job_id, max(queued_at, run_at) FROM jobs INDEXED BY jobs_claim "
    "WHERE status = 'waiting' AND required_role = ?1 AND kind = ?2 AND priority = ?3 "
    "AND run_at <= ?4 ORDER BY queued_at, job_id LIMIT ?5"
)


def oldest_due(conn: sqlite3.Connection, now: float, levels: list[int], per_level: int,
               aging_s: float) -> list[tuple[float, JobView]]:
    """The `per_level` oldest due waiting jobs of each priority in `levels` (by when they
    entered waiting), each with its ready time; one index seek per (role, kind, level)."""
    found: dict[int, list[tuple[float, str, str]]] = {p: [] for p in levels}
    for (role,) in conn.execute(SQL_WAITING_ROLES).fetchall():
        for (kind,) in conn.execute(SQL_WAITING_ROLE_KINDS, (role,)).fetchall():
            for p in levels:
                found[p] += [(ready, job_id, role) for job_id, ready in conn.execute(
                    SQL_PAIR_OLDEST_DUE, (role, kind, p, now, per_level))]
    heads: list[tuple[float, JobView]] = []
    for p in levels:
        for ready, job_id, _ in sorted(found[p])[:per_level]:
            row = conn.execute(SQL_GET_JOB, (job_id,)).fetchone()
            if row is not None:
                heads.append((ready, views._job_view(row, now, aging_s)))
    return heads
