"""The statements of a complete that carries its worker's next claim (eager dispatch,
coordd.store.postgres.eager): the fenced complete and the claim in ONE statement
(data-modifying CTEs: atomic without BEGIN/COMMIT, one round trip, one commit).

The complete happens only while the worker's gate decision stands (its heartbeat is the
one the decision was made from, and fresh) and no expired lease holds the next claim's
claim id; then the claim runs only if the complete did, and a claim id that already
holds a live lease answers that lease instead of a new job. When the statement changes
nothing (a refused complete, a workflow node or a result schema, a decision that no
longer stands) the caller runs the report in a transaction of its own, as before.
Parameters as sql.SQL_CLAIM's ($1 now, $2 worker, $3 lease_s, $4 claim id, $5 allowed
priorities, $6 roles, $7 kinds, $8 heartbeat_stale_s, $9..$11 the decision's heartbeat),
then the complete's.
"""

from __future__ import annotations

from coordd.store.postgres.sql import (
    BATCH_LIMIT, BATCH_TAKE, CLAIMED_COLS, COMPLETED, COMPLETED_EVENTS, NOW, TAKE, candidates)

_DECISION = (  # the worker's heartbeat is still the one its decision was made from
    "hb AS (SELECT 1 FROM workers w WHERE w.worker_id = $2 "
    f"AND w.heartbeat_at >= {NOW} - $8::float8 AND w.heartbeat_at = $9 "
    "AND w.heartbeat_json = $10 AND w.roles_json = $11), "
)
_ENDED = "de AS (" + COMPLETED_EVENTS.format(jobs="d", reason="$15") + "), "

# One worker: $12 job, $13 token, $16 result JSON; $14, $15 the texts of a complete that
# meets a requested cancel (postgres.apply.COMPLETE_TEXTS). One row when the complete
# happened: its status, then the next job's columns (sql.SQL_CLAIM's; NULL: none) and
# whether they are a replayed claim id's lease.
_ONE = (
    "WITH " + _DECISION +
    "rp AS (SELECT l.job_id, l.token, l.expires_at, l.lease_s FROM leases l "
    "WHERE l.worker_id = $2 AND l.claim_id = $4 AND l.job_id <> $12), "
    "l0 AS (DELETE FROM leases l WHERE l.job_id = $12 AND l.worker_id = $2 "
    f"AND l.token = $13 AND l.expires_at > {NOW} AND EXISTS (SELECT 1 FROM hb) "
    f"AND NOT EXISTS (SELECT 1 FROM rp WHERE rp.expires_at <= {NOW}) "
    "AND (SELECT x.workflow_id IS NULL AND x.result_schema IS NULL FROM jobs x "
    "WHERE x.job_id = $12) RETURNING l.job_id, l.worker_id), "
    "d AS (UPDATE jobs SET " + COMPLETED.format(result="$16", error="$14") +
    "FROM l0 WHERE jobs.job_id = l0.job_id RETURNING jobs.job_id, jobs.status, l0.worker_id), "
    + _ENDED +
    "c AS MATERIALIZED ({candidates}), " + TAKE +
    ", x AS (SELECT " + CLAIMED_COLS + f", j.last_token, {NOW} + $3::float8, $3::float8, "
    "false FROM j UNION ALL SELECT " + CLAIMED_COLS + ", rp.token, rp.expires_at, "
    "rp.lease_s, true FROM rp JOIN jobs j ON j.job_id = rp.job_id) "
    "SELECT d.status, x.* FROM d LEFT JOIN x ON true"
)
_NEXT_GATE = "AND EXISTS (SELECT 1 FROM d) AND NOT EXISTS (SELECT 1 FROM rp) "
SQL_COMPLETE_NEXT = _ONE.replace("{candidates}", candidates("1", _NEXT_GATE, False))
SQL_COMPLETE_NEXT_ROLES = _ONE.replace("{candidates}", candidates("1", _NEXT_GATE, True))

# Several workers sharing their claim parameters (one claim group; sql.SQL_CLAIM_BATCH's
# $1..$11, arrays where per worker), $12 job ids, $13 tokens, $16 results; $14, $15 as
# above. A row per complete that happened: its worker, status, then the next job's
# columns (NULL: none), and whether they are a replayed claim id's lease.
_MANY = (
    "WITH r AS (SELECT * FROM unnest($2::text[], $4::text[], $9::float8[], $10::text[], "
    "$11::text[], $12::text[], $13::bigint[], $16::text[]) WITH ORDINALITY AS r(worker_id, "
    "claim_id, hb_at, hb_json, roles_json, job_id, token, result_json, n) "
    "LIMIT cardinality($2::text[])), "  # (every row: sql._CLAIM_BATCH says why)
    "hb AS (SELECT r.* FROM r JOIN workers x ON x.worker_id = r.worker_id "
    f"AND x.heartbeat_at >= {NOW} - $8::float8 AND x.heartbeat_at = r.hb_at "
    "AND x.heartbeat_json = r.hb_json AND x.roles_json = r.roles_json), "
    "rp AS (SELECT l.worker_id, l.job_id, l.token, l.expires_at, l.lease_s FROM leases l "
    "JOIN r ON l.worker_id = r.worker_id AND l.claim_id = r.claim_id "
    "AND l.job_id <> r.job_id), "
    "l0 AS (DELETE FROM leases l USING hb WHERE l.job_id = hb.job_id "
    f"AND l.worker_id = hb.worker_id AND l.token = hb.token AND l.expires_at > {NOW} "
    "AND NOT EXISTS (SELECT 1 FROM rp WHERE rp.worker_id = hb.worker_id "
    f"AND rp.expires_at <= {NOW}) AND (SELECT x.workflow_id IS NULL "
    "AND x.result_schema IS NULL FROM jobs x WHERE x.job_id = l.job_id) "
    "RETURNING l.job_id, l.worker_id), "
    "d AS (UPDATE jobs SET " + COMPLETED.format(result="hb.result_json", error="$14") +
    "FROM l0 JOIN hb ON hb.job_id = l0.job_id AND hb.worker_id = l0.worker_id "
    "WHERE jobs.job_id = l0.job_id "
    "RETURNING jobs.job_id, jobs.status, l0.worker_id), "
    + _ENDED +
    "w AS (SELECT r.worker_id, r.claim_id, r.n FROM r JOIN d ON d.worker_id = r.worker_id "
    "WHERE NOT EXISTS (SELECT 1 FROM rp WHERE rp.worker_id = r.worker_id)), "
    + BATCH_TAKE +
    ", x AS (SELECT j.holder AS worker_id, " + CLAIMED_COLS + ", j.last_token, "
    f"{NOW} + $3::float8, $3::float8, false FROM j "
    "UNION ALL SELECT rp.worker_id, " + CLAIMED_COLS + ", rp.token, rp.expires_at, "
    "rp.lease_s, true FROM rp JOIN jobs j ON j.job_id = rp.job_id) "
    "SELECT d.worker_id, d.status, x.* FROM d LEFT JOIN x ON x.worker_id = d.worker_id"
)
SQL_COMPLETE_NEXT_BATCH = _MANY.replace("{candidates}", candidates(BATCH_LIMIT, "", False))
SQL_COMPLETE_NEXT_BATCH_ROLES = _MANY.replace("{candidates}",
                                              candidates(BATCH_LIMIT, "", True))


def complete_next_sql(roles: list[str], batch: bool = False) -> str:
    """The statement for workers of `roles` (one role: one ordered walk; several: each
    role's), for one worker or (`batch`) several."""
    if batch:
        return SQL_COMPLETE_NEXT_BATCH if len(roles) <= 1 else SQL_COMPLETE_NEXT_BATCH_ROLES
    return SQL_COMPLETE_NEXT if len(roles) <= 1 else SQL_COMPLETE_NEXT_ROLES
