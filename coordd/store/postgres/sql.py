"""Every statement PostgresStore runs (coordd.store.postgres.store).

`$1` is always the pinned `now` (NULL in production): NOW below reads it, else the
database's clock, so every time check and every stored time comes from one clock
(River's `coalesce(@now, now())`). `now()` is the transaction's start, the same value
however often a statement reads it.
"""

from __future__ import annotations

NOW = "coalesce($1::float8, extract(epoch FROM now())::float8)"

SQL_NOW = f"SELECT {NOW}"
SQL_EVENT = (
    "INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    f"VALUES ($2, {NOW}, $3, $4, $5, $6)"
)

# ---------------------------------------------------------------- heartbeat, enqueue

SQL_HEARTBEAT = (
    "WITH w AS (INSERT INTO workers (worker_id, roles_json, heartbeat_json, heartbeat_at, "
    f"first_seen_at) VALUES ($2, $3, $4, {NOW}, {NOW}) ON CONFLICT (worker_id) DO UPDATE SET "
    "roles_json = excluded.roles_json, heartbeat_json = excluded.heartbeat_json, "
    "heartbeat_at = excluded.heartbeat_at) "
    f"SELECT {NOW}, coalesce((SELECT array_agg(l.job_id ORDER BY l.job_id) FROM leases l "
    "JOIN jobs j ON j.job_id = l.job_id WHERE l.worker_id = $2 AND j.cancel_requested), "
    "'{}'::text[])"
)
SQL_ENQUEUE = (
    "WITH r AS (SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::int[], "
    "$6::text[], $7::int[], $8::float8[], $9::float8[], $10::text[], $11::float8[], "
    "$12::text[], $13::text[], $14::text[]) WITH ORDINALITY AS r(job_id, kind, "
    "required_role, priority, payload_json, max_attempts, run_at, delay_s, idempotency_key, "
    "max_runtime_s, gates_json, result_schema, request_sha256, ord)), "
    "ins AS (INSERT INTO jobs (job_id, kind, required_role, priority, payload_json, status, "
    "max_attempts, run_at, queued_at, created_at, updated_at, idempotency_key, "
    "max_runtime_s, gates_json, result_schema, request_sha256) "
    "SELECT job_id, kind, required_role, priority, payload_json, 'waiting', max_attempts, "
    f"coalesce(run_at, {NOW} + coalesce(delay_s, 0)), {NOW}, {NOW}, {NOW}, idempotency_key, "
    "max_runtime_s, gates_json, result_schema, request_sha256 FROM r ORDER BY ord "
    "ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING "
    "RETURNING job_id), "
    "ev AS (INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    f"SELECT job_id, {NOW}, NULL, NULL, 'waiting', 'enqueued' FROM ins) "
    "SELECT job_id FROM ins"
)
SQL_BY_KEYS = ("SELECT idempotency_key, job_id, request_sha256 FROM jobs "
               "WHERE idempotency_key = ANY($1::text[])")

# ---------------------------------------------------------------- claim

SQL_CLAIM_WORKER = (  # one row, with NOW, whether or not the worker is known
    f"SELECT {NOW}, w.roles_json, w.heartbeat_json, w.heartbeat_at "
    "FROM (SELECT 1) one LEFT JOIN workers w ON w.worker_id = $2"
)
CLAIMED_COLS = ("j.job_id, j.kind, j.required_role, j.priority, j.payload_json, j.attempts, "
                "j.checkpoint_json, j.max_runtime_s")
SQL_CLAIM_REPLAY = (
    f"SELECT {CLAIMED_COLS}, l.token, l.expires_at, l.lease_s FROM leases l "
    f"JOIN jobs j ON j.job_id = l.job_id WHERE l.worker_id = $2 AND l.claim_id = $3 "
    f"AND l.expires_at > {NOW}"
)
SQL_CLAIM_REPLAYS = (  # SQL_CLAIM_REPLAY's columns, then the worker, for workers $2, ids $3
    f"SELECT {CLAIMED_COLS}, l.token, l.expires_at, l.lease_s, l.worker_id FROM leases l "
    "JOIN unnest($2::text[], $3::text[]) AS r(worker_id, claim_id) "
    "ON l.worker_id = r.worker_id AND l.claim_id = r.claim_id "
    f"JOIN jobs j ON j.job_id = l.job_id WHERE l.expires_at > {NOW}"
)
# $2 worker, $3 lease_s, $4 claim_id, $5 allowed priorities, $6 roles, $7 kinds (NULL:
# any), $8 heartbeat_stale_s; $9..$11 (or NULL): the heartbeat (at, readings, roles) the
# gate decision was made from, which must still be the worker's last. The MATERIALIZED CTE is Oban's fence: the planner may not
# turn the LIMIT 1 subquery into a loop that updates more rows than it locked. Jobs with
# per-job gate overrides are never candidates here (PostgresStore refuses them at enqueue).
# Candidates are walked on the role-led jobs_claim_role index, so a claim never steps over
# the waiting jobs of roles it does not take: one role (SQL_CLAIM) is one ordered walk, the
# role an InitPlan so the cached generic plan is as good as a custom one; several
# (SQL_CLAIM_ROLES) walk each role (a LATERAL), lock each one's best and take the best of
# those (one extra row locked per extra role). See docs/decisions.md (store parts).
_CANDIDATE = (  # {role}: the role predicate; {limit}: how many
    "SELECT job_id, priority, queued_at FROM jobs WHERE status = 'waiting' AND {role} "
    f"AND run_at <= {NOW} AND priority = ANY($5::int[]) "
    "AND ($7::text[] IS NULL OR kind = ANY($7::text[])) AND gates_json IS NULL {worker}"
    "ORDER BY required_role, priority, queued_at, job_id LIMIT {limit} FOR UPDATE SKIP LOCKED"
)  # (one role: ordering by it first changes nothing, and names the index's order)
_WORKER_FRESH = (
    "AND EXISTS (SELECT 1 FROM workers w WHERE w.worker_id = $2 "
    f"AND w.heartbeat_at >= {NOW} - $8::float8 AND ($9::float8 IS NULL OR "
    "(w.heartbeat_at = $9 AND w.heartbeat_json = $10 AND w.roles_json = $11))) "
)


def candidates(limit: str, worker: str, roles: bool) -> str:
    """The candidate CTE's body: one role's walk, or each role's (`roles`) merged."""
    if not roles:
        return _CANDIDATE.format(role="required_role = (SELECT ($6::text[])[1])", limit=limit,
                                 worker=worker)
    # a range, not `=`: with `=` the planner counts the order as given by any index and
    # may walk jobs_claim, filtering the roles out (every waiting job, for a role with none)
    walk = _CANDIDATE.format(role="required_role >= r.role AND required_role <= r.role",
                             limit=limit, worker=worker)
    return ("SELECT x.job_id, x.priority, x.queued_at FROM (SELECT DISTINCT "
            f"unnest((SELECT $6::text[]))) AS r(role) CROSS JOIN LATERAL ({walk}) x "
            f"ORDER BY x.priority, x.queued_at, x.job_id LIMIT {limit}")


TAKE = (  # the candidate CTE `c` taken by worker $2 under claim id $4 for $3 s: CTE j
    f"j AS (UPDATE jobs SET status = 'running', attempts = jobs.attempts + 1, "
    f"last_token = jobs.last_token + 1, updated_at = {NOW} FROM c "
    "WHERE jobs.job_id = c.job_id RETURNING jobs.*), "
    "l AS (INSERT INTO leases (job_id, worker_id, token, claim_id, granted_at, expires_at, "
    f"lease_s) SELECT job_id, $2, last_token, $4, {NOW}, {NOW} + $3::float8, $3::float8 FROM j), "
    "e AS (INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    f"SELECT job_id, {NOW}, $2, 'waiting', 'running', 'claimed (token ' || last_token || ')' "
    "FROM j) "
)
_CLAIM_TAKE = TAKE + f"SELECT {CLAIMED_COLS}, j.last_token, {NOW} + $3::float8, $3::float8 FROM j"
SQL_CLAIM = ("WITH c AS MATERIALIZED (" + candidates("1", _WORKER_FRESH, False) + "), "
             + _CLAIM_TAKE)  # one role
SQL_CLAIM_ROLES = ("WITH c AS MATERIALIZED (" + candidates("1", _WORKER_FRESH, True)
                   + "), " + _CLAIM_TAKE)  # several roles
SQL_ANY_RUNNABLE = f"SELECT 1 FROM jobs WHERE status = 'waiting' AND run_at <= {NOW} LIMIT 1"
SQL_DEAD_LETTER_TAKEN = (  # a job just taken whose stored data does not decode
    "WITH d AS (DELETE FROM leases WHERE job_id = $2), "
    f"u AS (UPDATE jobs SET status = 'failed', updated_at = {NOW}, finished_at = {NOW}, "
    "last_error = $4 WHERE job_id = $2) "
    "INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    f"VALUES ($2, {NOW}, $3, 'running', 'failed', $5)"
)

# ---------------------------------------------------------------- lease holder calls

# Why a fenced call matched nothing: the job as coordd.rules.transitions.fence reads it.
_HELD = ("j.status, j.cancel_requested, j.max_runtime_s, j.attempts, j.max_attempts, "
         "j.last_token, l.worker_id, l.token, l.granted_at, l.expires_at, j.result_schema, "
         "j.workflow_id")  # coordd.rules.transitions.Held, in its order
SQL_FENCE_STATE = (
    f"SELECT {_HELD}, {NOW} FROM jobs j LEFT JOIN leases l ON l.job_id = j.job_id "
    "WHERE j.job_id = $2"
)
_FENCE = ("l.job_id = r.job_id AND l.worker_id = r.worker_id AND l.token = r.token "
          f"AND l.expires_at > {NOW}")
SQL_RENEW_BATCH = (  # $2 job ids, $3 workers, $4 tokens, $5 lease_s
    "WITH r AS (SELECT * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::float8[]) "
    "AS r(job_id, worker_id, token, lease_s)) "
    f"UPDATE leases l SET expires_at = {NOW} + r.lease_s, lease_s = r.lease_s FROM r, jobs j "
    f"WHERE {_FENCE} AND j.job_id = l.job_id "
    f"AND (j.max_runtime_s IS NULL OR {NOW} <= l.granted_at + j.max_runtime_s) "
    "RETURNING l.job_id, l.expires_at, l.lease_s, j.cancel_requested"
)
COMPLETED = (  # a complete's job columns ({result}): a requested cancel wins ({error})
    "status = CASE WHEN jobs.cancel_requested THEN 'cancelled' ELSE 'succeeded' END, "
    "result_json = CASE WHEN jobs.cancel_requested THEN jobs.result_json ELSE {result} END, "
    "artifact_sha256 = CASE WHEN jobs.cancel_requested THEN jobs.artifact_sha256 END, "
    "last_error = CASE WHEN jobs.cancel_requested THEN {error}::text END, "
    f"cancel_requested = false, updated_at = {NOW}, finished_at = {NOW} "
)
COMPLETED_EVENTS = (  # the events of the CTE {jobs} (job_id, status, worker_id) completed
    "INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    f"SELECT job_id, {NOW}, worker_id, 'running', status, CASE WHEN status = 'cancelled' "
    "THEN {reason}::text END FROM {jobs}"
)
# $2 job ids, $3 workers, $4 tokens, $5 results (JSON text); $6, $7: last_error and event
# reason of a complete that meets a requested cancel (postgres.apply.COMPLETE_TEXTS).
# Not matched: workflow nodes (they settle in a transaction of their own,
# postgres.limits.complete_checked) and jobs with a result schema (judged there too).
# `LIMIT cardinality($2)` keeps every row: see _CLAIM_BATCH (a cached generic plan).
SQL_COMPLETE_BATCH = (
    "WITH r AS (SELECT * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::text[]) "
    "AS r(job_id, worker_id, token, result_json) LIMIT cardinality($2::text[])), "
    f"l AS (DELETE FROM leases l USING r WHERE {_FENCE} AND (SELECT x.workflow_id IS NULL "
    "AND x.result_schema IS NULL FROM jobs x WHERE x.job_id = l.job_id) "
    "RETURNING l.job_id, l.worker_id), "
    "j AS (UPDATE jobs SET " + COMPLETED.format(result="r.result_json", error="$6") +
    "FROM l JOIN r ON r.job_id = l.job_id AND r.worker_id = l.worker_id "
    "WHERE jobs.job_id = l.job_id "
    "RETURNING jobs.job_id, jobs.status, l.worker_id), "
    "e AS (" + COMPLETED_EVENTS.format(jobs="j", reason="$7") + ") "
    "SELECT job_id, status, worker_id FROM j"
)
SQL_CHECKPOINT = (  # $2 job, $3 worker, $4 token, $5 checkpoint JSON
    f"UPDATE jobs SET checkpoint_json = $5, updated_at = {NOW} FROM leases l "
    f"WHERE jobs.job_id = $2 AND l.job_id = jobs.job_id AND l.worker_id = $3 AND l.token = $4 "
    f"AND l.expires_at > {NOW} RETURNING jobs.job_id"
)
# fail / release: lock the job, end the lease if it is the presented, live one; the
# caller decides the transition from what comes back and writes it in the same transaction
SQL_END_LEASE = (
    "WITH j AS (SELECT * FROM jobs WHERE job_id = $2 FOR UPDATE), "
    "l AS (DELETE FROM leases l WHERE l.job_id = $2 AND l.worker_id = $3 AND l.token = $4 "
    f"AND l.expires_at > {NOW} RETURNING l.*) "
    f"SELECT {_HELD}, {NOW} FROM j JOIN l ON l.job_id = j.job_id"
)
SQL_TO_TERMINAL = (  # $2 job, $3 status, $4 last_error
    f"UPDATE jobs SET status = $3, last_error = $4, updated_at = {NOW}, finished_at = {NOW}, "
    "cancel_requested = false WHERE job_id = $2"
)
SQL_TO_WAITING = (  # $2 job, $3 last_error, $4 run_at
    f"UPDATE jobs SET status = 'waiting', last_error = $3, run_at = $4, queued_at = {NOW}, "
    f"updated_at = {NOW} WHERE job_id = $2"
)
SQL_RELEASE_JOB = (  # $2 job, $3 last_error, $4 checkpoint JSON or NULL (kept)
    "UPDATE jobs SET status = 'waiting', attempts = greatest(0, attempts - 1), "
    "preemptions = preemptions + 1, last_error = $3, "
    "checkpoint_json = coalesce($4, checkpoint_json), "
    f"run_at = {NOW}, queued_at = {NOW}, updated_at = {NOW} WHERE job_id = $2"
)
SQL_SET_CHECKPOINT = f"UPDATE jobs SET checkpoint_json = $3, updated_at = {NOW} WHERE job_id = $2"

# ---------------------------------------------------------------- admin, reaper

SQL_LOCK_STATUS = f"SELECT status, {NOW} FROM jobs WHERE job_id = $2 FOR UPDATE"
SQL_REQUEST_CANCEL = f"UPDATE jobs SET cancel_requested = true, updated_at = {NOW} WHERE job_id = $2"
SQL_RETRY = (
    f"UPDATE jobs SET status = 'waiting', attempts = 0, run_at = {NOW}, queued_at = {NOW}, "
    f"updated_at = {NOW}, finished_at = NULL, cancel_requested = false, last_error = NULL "
    "WHERE job_id = $2 RETURNING run_at"
)
# The leases of the CTE `x` (job ids, locked by it) end as coordd.rules.transitions.lost_lease
# decides: waiting again at the back of its priority, failed once attempts are spent,
# cancelled if a cancel was requested, an event each; $3..$9 its texts (the reaper's,
# postgres.apply.REAP_TEXTS, or a lost worker's). Leaves the CTE `j` (job_id, status).
END_LOST_LEASES = (
    "l AS (DELETE FROM leases USING x WHERE leases.job_id = x.job_id "
    "RETURNING leases.job_id, leases.worker_id), "
    "j AS (UPDATE jobs SET status = CASE WHEN jobs.cancel_requested THEN 'cancelled' "
    "WHEN jobs.attempts >= jobs.max_attempts THEN 'failed' ELSE 'waiting' END, "
    "last_error = CASE WHEN jobs.cancel_requested THEN $3::text "
    "WHEN jobs.attempts >= jobs.max_attempts THEN $5::text "
    "ELSE $7::text || l.worker_id || $8::text END, "
    "finished_at = CASE WHEN jobs.cancel_requested OR jobs.attempts >= jobs.max_attempts "
    f"THEN {NOW} END, "
    "run_at = CASE WHEN jobs.cancel_requested OR jobs.attempts >= jobs.max_attempts "
    f"THEN jobs.run_at ELSE {NOW} END, "
    "queued_at = CASE WHEN jobs.cancel_requested OR jobs.attempts >= jobs.max_attempts "
    f"THEN jobs.queued_at ELSE {NOW} END, "
    f"cancel_requested = false, updated_at = {NOW} FROM l WHERE jobs.job_id = l.job_id "
    "RETURNING jobs.job_id, jobs.status, l.worker_id), "
    "e AS (INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    f"SELECT job_id, {NOW}, worker_id, 'running', status, CASE WHEN status = 'cancelled' "
    "THEN $4::text WHEN status = 'failed' THEN $6::text ELSE $9::text END FROM j) "
)

# One idempotent statement: expired leases (oldest first, $2 at most; rows another reaper
# holds are skipped) end, their jobs go back to waiting at the back of their priority, or
# to failed once attempts are spent, or cancelled if a cancel was requested, as
# coordd.rules.transitions.lost_lease decides; $3..$9 its texts (postgres.apply.REAP_TEXTS).
# Workflow nodes' leases are left to postgres.workflows.reap_nodes (settled with them).
SQL_REAP = (
    "WITH x AS (SELECT l.job_id FROM leases l JOIN jobs n ON n.job_id = l.job_id "
    f"WHERE l.expires_at <= {NOW} AND n.workflow_id IS NULL ORDER BY l.expires_at "
    "LIMIT $2 FOR UPDATE OF l SKIP LOCKED), "
    + END_LOST_LEASES +
    "SELECT count(*), count(*) FILTER (WHERE status = 'waiting') FROM j"
)

# ---------------------------------------------------------------- reads

SQL_JOB_ROW = (  # the columns of coordd.store.reads.SQL_JOB_ROW, in its order, then NOW
    "SELECT j.job_id, j.kind, j.required_role, j.priority, j.status, j.attempts, "
    "j.max_attempts, j.run_at, j.queued_at, j.created_at, j.updated_at, j.finished_at, "
    "j.payload_json, j.result_json, j.last_error, j.checkpoint_json, j.cancel_requested, "
    "j.idempotency_key, j.max_runtime_s, j.gates_json, a.sha256, a.size, a.path, "
    "l.worker_id, l.token, l.granted_at, l.expires_at, l.lease_s, "
    f"{NOW} FROM jobs j LEFT JOIN leases l ON l.job_id = j.job_id "
    "LEFT JOIN artifacts a ON a.sha256 = j.artifact_sha256 "
)
SQL_GET_JOB = SQL_JOB_ROW + "WHERE j.job_id = $2"
SQL_EVENTS = (
    "SELECT at, from_status, to_status, worker_id, reason FROM job_events "
    "WHERE job_id = $1 ORDER BY event_id"
)
_LIST_FILTERS = (
    "WHERE ($2::text IS NULL OR j.status = $2) AND ($3::text IS NULL OR j.kind = $3) "
    "AND ($4::text IS NULL OR j.required_role = $4) AND ($5::int IS NULL OR j.priority = $5) "
)
SQL_LIST_JOBS = (  # in job id order (time-ordered ids: enqueue order), after the job $6
    SQL_JOB_ROW + _LIST_FILTERS + "AND ($6::text IS NULL OR j.job_id > $6) "
    "ORDER BY j.job_id LIMIT $7"
)
SQL_LIST_JOBS_NEWEST = (
    SQL_JOB_ROW + _LIST_FILTERS + "AND ($6::text IS NULL OR j.job_id < $6) "
    "ORDER BY j.job_id DESC LIMIT $7"
)
SQL_JOB_EXISTS = "SELECT 1 FROM jobs WHERE job_id = $1"
SQL_OLDEST_DUE = (  # the $3 oldest due waiting jobs of level $2 (coordd.service.waiting_report)
    SQL_JOB_ROW + f"WHERE j.status = 'waiting' AND j.priority = $2 AND j.run_at <= {NOW} "
    "ORDER BY j.queued_at, j.job_id LIMIT $3"
)
# jobs by (status, priority), summed over the sessions' shards (schema MIGRATION_JOB_COUNTS),
# and how many shard rows there are (reads.status folds them past COUNT_SHARD_ROWS_MAX)
SQL_COUNTS = (
    "SELECT status, priority, sum(n)::bigint, sum(count(*)) OVER ()::int FROM job_counts "
    "GROUP BY status, priority"
)
SQL_FOLD_COUNTS = (  # shards of sessions that are gone, folded into shard 0
    "WITH gone AS (DELETE FROM job_counts WHERE shard <> 0 AND shard NOT IN "
    "(SELECT pid FROM pg_stat_activity) RETURNING status, priority, n) "
    "INSERT INTO job_counts AS c (shard, status, priority, n) SELECT 0, status, priority, "
    "sum(n) FROM gone GROUP BY status, priority ORDER BY status, priority "
    "ON CONFLICT (shard, status, priority) DO UPDATE SET n = c.n + excluded.n"
)
SQL_STATUS_LIVE = (  # $2 heartbeat_stale_s; the queue latency as coordd.store.latency
    f"SELECT (SELECT count(*) FROM workers), (SELECT count(*) FROM workers "
    f"WHERE heartbeat_at >= {NOW} - $2::float8 AND offline_at IS NULL), "
    "(SELECT count(*) FROM leases), "
    f"{NOW} - (SELECT min(greatest(queued_at, run_at)) FROM jobs WHERE status = 'waiting' "
    f"AND greatest(queued_at, run_at) <= {NOW})"
)

# ---------------------------------------------------------------- coordination

SQL_TRY_LEADER = "SELECT pg_try_advisory_lock(hashtext($1))"
# the refused priorities where a candidate for this worker waits ($2 roles, $3 kinds, $4 allowed)
SQL_GATED_PRIORITIES = (
    f"SELECT DISTINCT priority FROM jobs WHERE status = 'waiting' AND run_at <= {NOW} "
    "AND required_role = ANY($2::text[]) AND ($3::text[] IS NULL OR kind = ANY($3::text[])) "
    "AND NOT (priority = ANY($4::int[]))"
)
# Claims of several workers that share their parameters ($3 lease_s, $5 priorities, $6
# roles, $7 kinds, $8 heartbeat_stale_s), each with the heartbeat its decision was made
# from ($2 workers, $4 claim ids, $9 at, $10 readings, $11 roles): the jobs are handed
# out in claim order to the workers whose heartbeat still holds, in the order they asked.
BATCH_TAKE = (  # the candidates `c` (for the workers `w`: worker_id, claim_id, n) taken
    "c AS MATERIALIZED ({candidates}), "  # in claim order by the workers in ask order
    "p AS (SELECT cn.job_id, wn.worker_id, wn.claim_id FROM (SELECT job_id, row_number() "
    "OVER (ORDER BY priority, queued_at, job_id) AS k FROM c) cn JOIN (SELECT worker_id, "
    "claim_id, row_number() OVER (ORDER BY n) AS k FROM w) wn USING (k)), "
    "j AS (UPDATE jobs SET status = 'running', attempts = jobs.attempts + 1, "
    f"last_token = jobs.last_token + 1, updated_at = {NOW} FROM p "
    "WHERE jobs.job_id = p.job_id RETURNING jobs.*, p.worker_id AS holder, "
    "p.claim_id AS holder_claim_id), "
    "l AS (INSERT INTO leases (job_id, worker_id, token, claim_id, granted_at, expires_at, "
    f"lease_s) SELECT job_id, holder, last_token, holder_claim_id, {NOW}, {NOW} + $3::float8, "
    "$3::float8 FROM j), "
    "e AS (INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    f"SELECT job_id, {NOW}, holder, 'waiting', 'running', 'claimed (token ' || last_token "
    "|| ')' FROM j) "
)
# `LIMIT cardinality(...)` keeps every row: it gives a generic plan the estimate of one row
# (a custom plan's: the array's length), so the plan cache keeps the generic plan instead
# of planning the statement at every call (docs/decisions.md, pgone).
_CLAIM_BATCH = (
    "WITH w AS (SELECT r.worker_id, r.claim_id, r.n FROM (SELECT * FROM unnest($2::text[], "
    "$4::text[], $9::float8[], $10::text[], $11::text[]) WITH ORDINALITY AS r(worker_id, "
    "claim_id, hb_at, hb_json, roles_json, n) LIMIT cardinality($2::text[])) r "
    "JOIN workers x ON x.worker_id = r.worker_id "
    f"AND x.heartbeat_at >= {NOW} - $8::float8 AND x.heartbeat_at = r.hb_at "
    "AND x.heartbeat_json = r.hb_json AND x.roles_json = r.roles_json), "
    + BATCH_TAKE +
    f"SELECT {CLAIMED_COLS}, j.last_token, {NOW} + $3::float8, $3::float8, j.holder FROM j"
)
BATCH_LIMIT = "(SELECT count(*) FROM w)"
SQL_CLAIM_BATCH = _CLAIM_BATCH.replace("{candidates}", candidates(BATCH_LIMIT, "", False))
SQL_CLAIM_BATCH_ROLES = _CLAIM_BATCH.replace("{candidates}",
                                             candidates(BATCH_LIMIT, "", True))


def claim_sql(roles: list[str], batch: bool = False) -> str:
    """The claim statement for a worker of `roles` (one: SQL_CLAIM; several: the
    per-role walk), or the batch's."""
    if batch:
        return SQL_CLAIM_BATCH if len(roles) <= 1 else SQL_CLAIM_BATCH_ROLES
    return SQL_CLAIM if len(roles) <= 1 else SQL_CLAIM_ROLES
