"""SQL of the oldest due waiting jobs of a priority (`status`'s waiting list,
coordd.waiting_report), walked over the claim index (coordd.store.claim_index): one seek
per waiting role, per kind of it, and per (role, kind, level), whatever the queue's size.
"""

from __future__ import annotations

from coordd.store.claim_index import SQL_ROLE_KINDS

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
