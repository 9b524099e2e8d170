"""The claim index led by what a worker filters on, and the candidate walks over it.

A worker takes only jobs of its roles and kinds. With the index led by (required_role, kind),
each (role, kind) pair the worker can take is one contiguous, already ordered run of the index
(priority, queued_at, job_id): `coordd.store.sqlite.leases` walks one cursor per pair and merges
them in claim order, so a claim never steps over a job it could not take, however many wait
ahead of it (issue 21, finding 9).
"""

from __future__ import annotations

# The claim index migration (issue 21): same name and partial condition, new column order.
MIGRATION = """
    DROP INDEX jobs_claim;
    CREATE INDEX jobs_claim ON jobs (required_role, kind, priority, queued_at, job_id,
        run_at, status, gates_json) WHERE status = 'waiting'
"""

# Strict priority: one (role ?1, kind ?2) run from level ?3 on, in claim order; ?4 now.
SQL_PAIR_WALK = (
    "SELECT priority, queued_at, job_id, gates_json FROM jobs INDEXED BY jobs_claim "
    "WHERE status = 'waiting' AND required_role = ?1 AND kind = ?2 AND priority >= ?3 "
    "AND run_at <= ?4 ORDER BY priority, queued_at, job_id"
)
# With aging: one level ?3 of a pair, queued at or before ?4, runnable at ?5, ?6 rows.
SQL_PAIR_LEVEL = (
    "SELECT priority, queued_at, job_id, gates_json FROM jobs INDEXED BY jobs_claim "
    "WHERE status = 'waiting' AND required_role = ?1 AND kind = ?2 AND priority = ?3 "
    "AND queued_at <= ?4 AND run_at <= ?5 ORDER BY queued_at, job_id LIMIT ?6"
)
# The kinds waiting for role ?1, one index seek each (a skip-scan): for a worker that
# names no kinds.
SQL_ROLE_KINDS = (
    "WITH RECURSIVE k(kind) AS ("
    "SELECT min(kind) FROM jobs INDEXED BY jobs_claim "
    "WHERE status = 'waiting' AND required_role = ?1 "
    "UNION ALL SELECT (SELECT min(kind) FROM jobs INDEXED BY jobs_claim "
    "WHERE status = 'waiting' AND required_role = ?1 AND kind > k.kind) "
    "FROM k WHERE k.kind IS NOT NULL) "
    "SELECT kind FROM k WHERE kind IS NOT NULL"
)
SQL_ANY_RUNNABLE = (
    "SELECT 1 FROM jobs INDEXED BY jobs_claim WHERE status = 'waiting' AND run_at <= ? LIMIT 1"
)
