"""Every statement of PostgresStore's workflows (coordd.store.postgres.workflows).

Row shapes are SQLite's (coordd.store.workflows), so the views and the state machine are
shared code. `$1` is the pinned `now` (sql.NOW) in every statement that reads the time.
A workflow's nodes are in job id order: ids are time-ordered and made in topological
order (coordd.ids), as SQLite's rowid order is.
"""

from __future__ import annotations

from coordd.store.postgres.sql import NOW

# The workflow's row lock: taken before any of its nodes' rows by every transaction that
# changes a node (the one lock order: workflow, then jobs; claims skip locked rows).
SQL_LOCK_OF_JOB = (
    "SELECT w.workflow_id FROM workflows w WHERE w.workflow_id = "
    "(SELECT workflow_id FROM jobs WHERE job_id = $1) FOR UPDATE OF w"
)
SQL_LOCK_OF_WORKER = (  # the workflows of the nodes worker $1 holds, locked in id order
    "SELECT w.workflow_id FROM workflows w WHERE w.workflow_id IN (SELECT j.workflow_id "
    "FROM leases l JOIN jobs j ON j.job_id = l.job_id WHERE l.worker_id = $1 "
    "AND j.workflow_id IS NOT NULL) ORDER BY w.workflow_id FOR UPDATE OF w"
)
SQL_IS_NODE = "SELECT workflow_id FROM jobs WHERE job_id = $1 AND workflow_id IS NOT NULL"
SQL_LOCK = "SELECT workflow_id FROM workflows WHERE workflow_id = $1 FOR UPDATE"

# ---------------------------------------------------------------- submit

SQL_INSERT_WORKFLOW = (  # $2 id, $3 name, $4 key, $5 schedule, $6 spec sha256
    "INSERT INTO workflows (workflow_id, name, status, idempotency_key, schedule_id, "
    f"created_at, updated_at, spec_sha256) VALUES ($2, $3, 'running', $4, $5, {NOW}, {NOW}, "
    "$6) ON CONFLICT (idempotency_key) DO NOTHING RETURNING workflow_id"
)
SQL_WORKFLOW_BY_KEY = "SELECT workflow_id, spec_sha256 FROM workflows WHERE idempotency_key = $1"
# $2 workflow; per node, in topological order: $3 job id, $4 kind, $5 role, $6 priority,
# $7 payload JSON, $8 status, $9 max_attempts, $10 max_runtime_s, $11 name, $12 event
# reason, $13 gate overrides JSON, $14 result schema
SQL_INSERT_NODES = (
    "WITH r AS (SELECT * FROM unnest($3::text[], $4::text[], $5::text[], $6::int[], "
    "$7::text[], $8::text[], $9::int[], $10::float8[], $11::text[], $12::text[], "
    "$13::text[], $14::text[]) WITH ORDINALITY AS r(job_id, kind, required_role, priority, "
    "payload_json, status, max_attempts, max_runtime_s, node, reason, gates_json, "
    "result_schema, ord)), "
    "ins AS (INSERT INTO jobs (job_id, kind, required_role, priority, payload_json, status, "
    "max_attempts, run_at, queued_at, created_at, updated_at, max_runtime_s, workflow_id, "
    "node, gates_json, result_schema) SELECT job_id, kind, required_role, priority, "
    f"payload_json, status, max_attempts, {NOW}, {NOW}, {NOW}, {NOW}, max_runtime_s, $2, "
    "node, gates_json, result_schema FROM r ORDER BY ord) "
    "INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    f"SELECT job_id, {NOW}, NULL, NULL, status, reason FROM r ORDER BY ord"
)
SQL_INSERT_EDGES = (  # $1 dependents, $2 dependencies, $3 policies
    "INSERT INTO workflow_edges (job_id, dep_job_id, policy) "
    "SELECT * FROM unnest($1::text[], $2::text[], $3::text[])"
)
SQL_NODE_IDS = "SELECT node, job_id FROM jobs WHERE workflow_id = $1 ORDER BY job_id"

# ---------------------------------------------------------------- settle

SQL_SETTLE_NODES = (
    "SELECT job_id, node, status, required_role, last_error FROM jobs "
    "WHERE workflow_id = $1 ORDER BY job_id"
)
SQL_EDGES = (  # a dependent's edges in its dependencies' order (SQLite: the primary key's)
    "SELECT e.job_id, e.dep_job_id, e.policy FROM jobs j JOIN workflow_edges e "
    "ON e.job_id = j.job_id WHERE j.workflow_id = $1 ORDER BY e.job_id, e.dep_job_id"
)
SQL_PAYLOADS = "SELECT job_id, payload_json FROM jobs WHERE job_id = ANY($1::text[])"
SQL_DEP_RESULTS = (
    "SELECT j.job_id, j.result_json, a.sha256, a.size, a.path FROM jobs j "
    "LEFT JOIN artifacts a ON a.sha256 = j.artifact_sha256 WHERE j.job_id = ANY($1::text[])"
)
SQL_PROMOTE = (  # $2 job, $3 payload JSON
    f"UPDATE jobs SET status = 'waiting', payload_json = $3, queued_at = {NOW}, "
    f"updated_at = {NOW} WHERE job_id = $2 AND status = 'blocked'"
)
SQL_SKIP = (  # $2 job, $3 reason
    f"UPDATE jobs SET status = 'skipped', last_error = $3, updated_at = {NOW}, "
    f"finished_at = {NOW}, cancel_requested = false WHERE job_id = $2 "
    "AND status IN ('blocked', 'waiting') RETURNING job_id"
)
SQL_FINISH_WORKFLOW = (  # $2 workflow, $3 status, $4 summary JSON
    f"UPDATE workflows SET status = $3, summary_json = $4, updated_at = {NOW}, "
    f"finished_at = {NOW} WHERE workflow_id = $2 AND status = 'running' RETURNING status"
)
SQL_TOUCH_WORKFLOW = f"UPDATE workflows SET updated_at = {NOW} WHERE workflow_id = $2"
SQL_RUNNING_WORKFLOWS = (
    "SELECT workflow_id FROM workflows WHERE status = 'running' ORDER BY created_at LIMIT $1"
)
# Waiting workflow nodes waiting (queued and due) for over $2 s while no worker with a
# heartbeat within $3 s, not offline, advertises their role; $4 at most, by workflow then
# job id (coordd.store.workflows.SQL_ABSENT's rule). Its partial index (schema
# MIGRATION_ABSENT) holds waiting nodes only: plain jobs, however many wait, cost nothing.
SQL_ABSENT = (
    "SELECT j.job_id, j.workflow_id, j.required_role, "
    f"{NOW} - greatest(j.queued_at, j.run_at) FROM jobs j "
    "WHERE j.status = 'waiting' AND j.workflow_id IS NOT NULL "
    f"AND j.queued_at <= {NOW} - $2::float8 AND j.run_at <= {NOW} - $2::float8 "
    "AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.heartbeat_at >= "
    f"{NOW} - $3::float8 AND w.offline_at IS NULL AND w.roles_json::jsonb ? j.required_role) "
    "ORDER BY j.workflow_id, j.job_id LIMIT $4"
)
# the node $2, skipped if it still waits and is due for over $3 s (the workflow is locked)
SQL_SKIP_ABSENT = (
    f"UPDATE jobs SET status = 'skipped', last_error = $4, updated_at = {NOW}, "
    f"finished_at = {NOW}, cancel_requested = false WHERE job_id = $2 AND status = 'waiting' "
    f"AND queued_at <= {NOW} - $3::float8 AND run_at <= {NOW} - $3::float8 RETURNING job_id"
)

# ---------------------------------------------------------------- node ends outside a batch

# expired leases of workflow nodes (sql.SQL_REAP leaves them to coordd's reap_nodes)
SQL_EXPIRED_NODES = (
    "SELECT l.job_id FROM leases l JOIN jobs j ON j.job_id = l.job_id "
    f"WHERE l.expires_at <= {NOW} AND j.workflow_id IS NOT NULL ORDER BY l.expires_at LIMIT $2"
)
SQL_END_EXPIRED = (  # lock the node, end its lease if still expired: what lost_lease reads
    "WITH j AS (SELECT * FROM jobs WHERE job_id = $2 FOR UPDATE), "
    f"l AS (DELETE FROM leases l WHERE l.job_id = $2 AND l.expires_at <= {NOW} "
    "RETURNING l.job_id, l.worker_id) "
    "SELECT l.worker_id, j.attempts, j.max_attempts, j.cancel_requested, "
    f"{NOW} FROM j JOIN l ON l.job_id = j.job_id"
)

# ---------------------------------------------------------------- cancel, reopen

SQL_OPEN_NODES = (
    "SELECT job_id, status FROM jobs WHERE workflow_id = $1 "
    "AND status IN ('blocked', 'waiting', 'running') ORDER BY job_id FOR UPDATE"
)
SQL_HAS_DEPS = "SELECT 1 FROM workflow_edges WHERE job_id = $1 LIMIT 1"
SQL_REBLOCK = (
    "UPDATE jobs SET status = 'blocked' WHERE job_id = $1 AND status = 'waiting' "
    "RETURNING job_id"
)
SQL_SKIPPED_DEPENDENTS = (
    "SELECT e.job_id FROM workflow_edges e JOIN jobs j ON j.job_id = e.job_id "
    "WHERE e.dep_job_id = $1 AND j.status = 'skipped' AND j.last_error LIKE 'dependency\\_%'"
)
SQL_UNSKIP = (
    "UPDATE jobs SET status = 'blocked', last_error = NULL, finished_at = NULL, "
    f"updated_at = {NOW} WHERE job_id = $2 AND status = 'skipped' RETURNING job_id"
)
SQL_REOPEN_WORKFLOW = (
    "UPDATE workflows SET status = 'running', summary_json = NULL, finished_at = NULL, "
    f"updated_at = {NOW} WHERE workflow_id = $2"
)
SQL_STATUS = "SELECT status FROM jobs WHERE job_id = $1"

# ---------------------------------------------------------------- reads

_WORKFLOW_COLS = ("workflow_id, name, status, idempotency_key, schedule_id, created_at, "
                  "updated_at, finished_at, summary_json")
SQL_GET_WORKFLOW = f"SELECT {_WORKFLOW_COLS} FROM workflows WHERE workflow_id = $1"
SQL_NODES = (
    "SELECT j.job_id, j.node, j.status, j.kind, j.required_role, j.attempts, j.max_attempts, "
    "j.result_json, j.last_error, a.sha256, a.size, a.path FROM jobs j "
    "LEFT JOIN artifacts a ON a.sha256 = j.artifact_sha256 WHERE j.workflow_id = $1 "
    "ORDER BY j.job_id"
)
SQL_LIST_WORKFLOWS = (
    f"SELECT {_WORKFLOW_COLS} FROM workflows WHERE ($1::text IS NULL OR status = $1) "
    "ORDER BY created_at DESC, workflow_id DESC LIMIT $2"
)
SQL_WORKFLOW_COUNTS = (
    "SELECT workflow_id, status, count(*) FROM jobs WHERE workflow_id = ANY($1::text[]) "
    "GROUP BY workflow_id, status"
)
