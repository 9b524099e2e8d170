"""The PostgreSQL schema: migrations keyed on the `coordd_schema_version` table, run under
a transaction-level advisory lock (two coordd starting together migrate once).

Tables and columns mean what they mean in SQLite (coordd.store.schema): times are Unix
seconds (float8), JSON is stored as text, exactly as coordd encoded it. A migration is one
entry of MIGRATIONS, never edited once released; a new one goes last.
"""

from __future__ import annotations

from typing import Any

from coordd import errors
from coordd.store.postgres.push_sql import MIGRATION_CLAIM_WAKE, MIGRATION_PUSH

MIGRATION_LOCK_KEY = "coordd-migrate"

SQL_VERSION_TABLE = "CREATE TABLE IF NOT EXISTS coordd_schema_version (version integer NOT NULL)"
SQL_LOCK = "SELECT pg_advisory_xact_lock(hashtext($1))"
SQL_VERSION = "SELECT max(version) FROM coordd_schema_version"
SQL_SET_VERSION = "INSERT INTO coordd_schema_version (version) VALUES ($1)"

MIGRATION_CORE = """
CREATE TABLE workers (
    worker_id      text PRIMARY KEY,
    roles_json     text NOT NULL,
    heartbeat_json text NOT NULL,
    heartbeat_at   float8 NOT NULL,
    first_seen_at  float8 NOT NULL
);
CREATE TABLE artifacts (
    sha256     text PRIMARY KEY,
    path       text NOT NULL,
    size       bigint NOT NULL,
    created_at float8 NOT NULL
);
CREATE TABLE jobs (
    job_id           text PRIMARY KEY,
    kind             text NOT NULL,
    required_role    text NOT NULL,
    priority         integer NOT NULL CHECK (priority BETWEEN 0 AND 3),
    payload_json     text NOT NULL,
    status           text NOT NULL CHECK (status IN
                       ('waiting','running','succeeded','failed','cancelled','blocked','skipped')),
    attempts         integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL CHECK (max_attempts >= 1),
    run_at           float8 NOT NULL,
    queued_at        float8 NOT NULL,
    created_at       float8 NOT NULL,
    updated_at       float8 NOT NULL,
    finished_at      float8,
    result_json      text,
    artifact_sha256  text REFERENCES artifacts(sha256),
    last_error       text,
    checkpoint_json  text,
    cancel_requested boolean NOT NULL DEFAULT false,
    idempotency_key  text UNIQUE,
    max_runtime_s    float8,
    gates_json       text,
    last_token       bigint NOT NULL DEFAULT 0,
    result_schema    text,
    request_sha256   text,
    preemptions      integer NOT NULL DEFAULT 0,
    workflow_id      text
);
CREATE INDEX jobs_claim ON jobs (priority, queued_at, job_id) WHERE status = 'waiting';
CREATE TABLE leases (
    job_id     text PRIMARY KEY REFERENCES jobs(job_id) ON DELETE CASCADE,
    worker_id  text NOT NULL,
    token      bigint NOT NULL,
    claim_id   text,
    granted_at float8 NOT NULL,
    expires_at float8 NOT NULL,
    lease_s    float8 NOT NULL
);
CREATE INDEX leases_expiry ON leases (expires_at);
CREATE INDEX leases_worker ON leases (worker_id);
CREATE UNIQUE INDEX leases_claim_id ON leases (worker_id, claim_id) WHERE claim_id IS NOT NULL;
CREATE TABLE job_events (
    event_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      text NOT NULL,
    at          float8 NOT NULL,
    worker_id   text,
    from_status text,
    to_status   text NOT NULL,
    reason      text
);
CREATE INDEX job_events_job ON job_events (job_id, event_id);
"""

# The hub's tables (coordd.store.messages.MIGRATION's, on PostgreSQL's types): `seq` orders
# messages sent at one instant as SQLite's rowid does; agent names sort by code point
# (COLLATE "C"), as SQLite compares them, whatever the database's collation.
MIGRATION_HUB = """
CREATE TABLE messages (
    seq          bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    message_id   text PRIMARY KEY,
    sender       text NOT NULL,
    recipient    text,
    message_type text NOT NULL,
    content      text NOT NULL,
    priority     integer NOT NULL CHECK (priority BETWEEN 0 AND 3),
    metadata     text,
    status       text NOT NULL CHECK (status IN ('pending','delivered','processed')),
    created_at   float8 NOT NULL,
    processed_at float8,
    expires_at   float8
);
CREATE INDEX messages_inbox ON messages (recipient, priority, created_at, seq)
    WHERE status <> 'processed';
CREATE INDEX messages_expiry ON messages (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX messages_done ON messages (processed_at) WHERE processed_at IS NOT NULL;
CREATE INDEX messages_broadcast_age ON messages (created_at) WHERE recipient IS NULL;
CREATE TABLE message_reads (
    message_id   text NOT NULL REFERENCES messages(message_id) ON DELETE CASCADE,
    reader       text NOT NULL,
    deliveries   integer NOT NULL,
    delivered_at float8 NOT NULL,
    visible_at   float8,
    processed_at float8,
    PRIMARY KEY (message_id, reader)
);
CREATE INDEX message_reads_reader ON message_reads (reader, processed_at);
CREATE TABLE agents (
    name          text COLLATE "C" PRIMARY KEY,
    status        text NOT NULL,
    metadata      text,
    heartbeat_at  float8 NOT NULL,
    first_seen_at float8 NOT NULL
);
"""

# A job's captured output (coordd.store.logs.MIGRATION's, on PostgreSQL's types).
MIGRATION_LOGS = """
CREATE TABLE job_logs (
    seq       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id    text NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
    token     bigint NOT NULL,
    attempt   integer NOT NULL,
    worker_id text NOT NULL,
    stream    text NOT NULL CHECK (stream IN ('stdout', 'stderr')),
    pos       bigint NOT NULL CHECK (pos >= 0),
    data      bytea NOT NULL,
    at        float8 NOT NULL,
    UNIQUE (job_id, token, stream, pos)
);
CREATE INDEX job_logs_job ON job_logs (job_id, seq);
"""

# Enrolment tokens (coordd.store.enrol.MIGRATION_ENROL_TOKENS', on PostgreSQL's types).
MIGRATION_ENROL = """
CREATE TABLE enrol_tokens (
    token_sha256 text PRIMARY KEY,
    worker_id    text NOT NULL,
    created_at   float8 NOT NULL,
    expires_at   float8 NOT NULL,
    used_at      float8,
    serial       text
);
"""

MIGRATION_GOVERNANCE = """
ALTER TABLE leases ADD COLUMN suspended_at float8, ADD COLUMN suspend_reason text,
    ADD COLUMN gate_open_at float8, ADD COLUMN vacate_reason text;
ALTER TABLE workers ADD COLUMN incarnation text, ADD COLUMN kinds_json text,
    ADD COLUMN broken_kinds_json text, ADD COLUMN offline_at float8;
CREATE TABLE reservations (
    job_id        text PRIMARY KEY REFERENCES jobs(job_id) ON DELETE CASCADE,
    worker_id     text NOT NULL,
    victim_job_id text NOT NULL,
    created_at    float8 NOT NULL,
    expires_at    float8 NOT NULL
);
CREATE INDEX reservations_worker ON reservations (worker_id, expires_at);
CREATE TABLE job_resources (
    job_id  text PRIMARY KEY REFERENCES jobs(job_id) ON DELETE CASCADE,
    gpus    integer NOT NULL,
    vram_mb integer NOT NULL,
    ram_mb  integer NOT NULL
);
ALTER TABLE leases ADD COLUMN gpu_ids text, ADD COLUMN vram_mb integer,
    ADD COLUMN ram_mb integer;
"""
"""Governance of running work (coordd.store.postgres.governance, .resources): a lease's
suspend/vacate state and grant, a worker's incarnation, kinds and goodbye, preemption's
reservations, jobs' resource requests."""

# Workflows (coordd.store.postgres.workflows): the graph's row, its edges, a node's name
# on its job; jobs.workflow_id (in MIGRATION_CORE) gets its foreign key. A workflow's node
# order is its jobs' id order (time-ordered ids, made in topological order).
MIGRATION_WORKFLOWS = """
CREATE TABLE workflows (
    workflow_id     text PRIMARY KEY,
    name            text NOT NULL,
    status          text NOT NULL CHECK (status IN
                      ('running','succeeded','partial','failed','cancelled')),
    idempotency_key text UNIQUE,
    schedule_id     text,
    created_at      float8 NOT NULL,
    updated_at      float8 NOT NULL,
    finished_at     float8,
    summary_json    text,
    spec_sha256     text
);
CREATE INDEX workflows_status ON workflows (status, created_at);
CREATE INDEX workflows_created ON workflows (created_at, workflow_id);
ALTER TABLE jobs ADD COLUMN node text;
ALTER TABLE jobs ADD CONSTRAINT jobs_workflow_fk FOREIGN KEY (workflow_id)
    REFERENCES workflows (workflow_id);
CREATE UNIQUE INDEX jobs_workflow ON jobs (workflow_id, node) WHERE workflow_id IS NOT NULL;
CREATE TABLE workflow_edges (
    job_id     text NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    dep_job_id text NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    policy     text NOT NULL CHECK (policy IN ('skip','run')),
    PRIMARY KEY (job_id, dep_job_id)
);
CREATE INDEX workflow_edges_dep ON workflow_edges (dep_job_id);
"""

# Fleet-wide limits (coordd.store.postgres.admission): what jobs consume, the units held
# by running jobs (released by a trigger on every lease row that goes, as on SQLite), the
# rate windows, reported usage and the runtime overrides.
MIGRATION_LIMITS = """
CREATE TABLE job_limits (
    job_id text NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
    name   text NOT NULL,
    units  integer NOT NULL CHECK (units >= 1),
    PRIMARY KEY (job_id, name)
);
CREATE INDEX job_limits_name ON job_limits (name, job_id);
CREATE TABLE limit_holds (
    name      text NOT NULL,
    job_id    text NOT NULL,
    units     integer NOT NULL,
    priority  integer NOT NULL,
    worker_id text NOT NULL,
    since     float8 NOT NULL,
    PRIMARY KEY (name, job_id)
);
CREATE INDEX limit_holds_job ON limit_holds (job_id);
CREATE FUNCTION coordd_limit_holds_release() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM limit_holds h USING gone WHERE h.job_id = gone.job_id;
    RETURN NULL;
END $$;
CREATE TRIGGER limit_holds_release AFTER DELETE ON leases REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION coordd_limit_holds_release();
CREATE TABLE limit_claims (
    name  text NOT NULL,
    at    float8 NOT NULL,
    units integer NOT NULL
);
CREATE INDEX limit_claims_window ON limit_claims (name, at);
CREATE TABLE limit_usage (
    name   text NOT NULL,
    metric text NOT NULL,
    at     float8 NOT NULL,
    amount float8 NOT NULL
);
CREATE INDEX limit_usage_window ON limit_usage (name, metric, at);
CREATE TABLE limit_overrides (
    name          text PRIMARY KEY,
    settings_json text NOT NULL,
    updated_at    float8 NOT NULL
);
"""

MIGRATION_RESUME_AT = "ALTER TABLE leases ADD COLUMN resume_at float8;"

# Artifacts in the database (coordd.store.postgres.artifacts): an upload's chunks as they
# arrive and its progress; an `artifacts` row makes them a stored artifact. EXTERNAL
# storage: chunks are stored uncompressed, so a range is read without inflating a chunk.
MIGRATION_ARTIFACTS = """
CREATE TABLE artifact_chunks (
    sha256 text NOT NULL,
    pos    bigint NOT NULL CHECK (pos >= 0),
    data   bytea NOT NULL,
    PRIMARY KEY (sha256, pos)
);
ALTER TABLE artifact_chunks ALTER COLUMN data SET STORAGE EXTERNAL;
CREATE TABLE artifact_uploads (
    sha256     text PRIMARY KEY,
    size       bigint NOT NULL CHECK (size >= 0),
    received   bigint NOT NULL CHECK (received >= 0),
    updated_at float8 NOT NULL
);
CREATE INDEX artifact_uploads_age ON artifact_uploads (updated_at);
CREATE INDEX artifacts_created ON artifacts (created_at);
CREATE INDEX jobs_artifact ON jobs (artifact_sha256) WHERE artifact_sha256 IS NOT NULL;
"""

# Schedules (coordd.store.postgres.schedules; coordd.store.workflow_schema's table, on
# PostgreSQL's types): names sort by code point, as on SQLite.
MIGRATION_SCHEDULES = """
CREATE TABLE schedules (
    schedule_id text PRIMARY KEY,
    name        text COLLATE "C" NOT NULL UNIQUE,
    cron        text NOT NULL,
    spec_json   text NOT NULL,
    next_at     float8 NOT NULL,
    last_slot   float8,
    fired       integer NOT NULL DEFAULT 0,
    created_at  float8 NOT NULL,
    updated_at  float8 NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_at);
"""

# Maintenance (coordd.store.postgres.maintenance): prune finds terminal jobs by their
# finish time, as SQLite's jobs_finished.
MIGRATION_MAINTENANCE = """
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
"""

# The claim walks each of the worker's roles in claim order (coordd.store.postgres.sql
# SQL_CLAIM): waiting jobs of other roles are never stepped over.
MIGRATION_CLAIM_ROLE = """
CREATE INDEX jobs_claim_role ON jobs (required_role, priority, queued_at, job_id)
    WHERE status = 'waiting';
"""

# worker_absent's look (coordd.store.postgres.workflows.skip_absent): the waiting
# workflow nodes only.
MIGRATION_ABSENT = """
CREATE INDEX jobs_workflow_waiting ON jobs (queued_at)
    WHERE status = 'waiting' AND workflow_id IS NOT NULL;
"""

# `status` without a scan of jobs (coordd.store.postgres.reads): jobs counted by (status,
# priority) in the transaction of every write, by row triggers that fire only when a row's
# status or priority changes. Running jobs are not counted here: a job runs exactly while
# it has a lease row, so `status` counts the (few) leases instead, and a claim or a complete
# costs one counter write, not two. Each session adds its deltas to rows of its own shard
# (its backend pid), so concurrent transactions never wait on one counter row; shards of
# sessions gone are folded into shard 0 (sql.SQL_FOLD_COUNTS). The oldest waiting job's age
# reads one entry of jobs_waiting_since. `jobs` is locked against writes while the counts
# are taken and the triggers made (a coordd still running the old code writes after).
MIGRATION_JOB_COUNTS = """
LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;
CREATE TABLE job_counts (
    shard    integer NOT NULL,
    status   text NOT NULL,
    priority integer NOT NULL,
    n        bigint NOT NULL,
    PRIMARY KEY (shard, status, priority)
);
INSERT INTO job_counts (shard, status, priority, n)
    SELECT 0, status, priority, count(*) FROM jobs WHERE status <> 'running'
    GROUP BY status, priority;
CREATE FUNCTION coordd_job_counts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.status <> 'running' THEN
        INSERT INTO job_counts AS c (shard, status, priority, n)
        VALUES (pg_backend_pid(), OLD.status, OLD.priority, -1)
        ON CONFLICT (shard, status, priority) DO UPDATE SET n = c.n - 1;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.status <> 'running' THEN
        INSERT INTO job_counts AS c (shard, status, priority, n)
        VALUES (pg_backend_pid(), NEW.status, NEW.priority, 1)
        ON CONFLICT (shard, status, priority) DO UPDATE SET n = c.n + 1;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER job_counts_insert AFTER INSERT ON jobs
    FOR EACH ROW EXECUTE FUNCTION coordd_job_counts();
CREATE TRIGGER job_counts_update AFTER UPDATE OF status, priority ON jobs FOR EACH ROW
    WHEN (OLD.status <> NEW.status OR OLD.priority <> NEW.priority)
    EXECUTE FUNCTION coordd_job_counts();
CREATE TRIGGER job_counts_delete AFTER DELETE ON jobs
    FOR EACH ROW EXECUTE FUNCTION coordd_job_counts();
CREATE INDEX jobs_waiting_since ON jobs ((greatest(queued_at, run_at)))
    WHERE status = 'waiting';
"""

MIGRATIONS: tuple[str, ...] = (
    MIGRATION_CORE,  # v1: workers, artifacts, jobs, leases, job_events
    MIGRATION_HUB,  # the hub: messages, message_reads, agents
    MIGRATION_LOGS,  # job_logs
    MIGRATION_ENROL,  # enrol_tokens
    MIGRATION_GOVERNANCE,  # leases' governance and grants, workers' state, reservations,
    # job_resources
    MIGRATION_WORKFLOWS,  # workflows, workflow_edges, jobs.node
    MIGRATION_LIMITS,  # job_limits, limit_holds (+ release trigger), limit_claims, ...
    MIGRATION_RESUME_AT,  # leases.resume_at: a pending resume (governance)
    MIGRATION_ARTIFACTS,  # artifact_chunks, artifact_uploads, artifacts' and jobs' indexes
    MIGRATION_SCHEDULES,  # schedules
    MIGRATION_MAINTENANCE,  # jobs_finished
    MIGRATION_CLAIM_ROLE,  # jobs_claim_role
    MIGRATION_ABSENT,  # jobs_workflow_waiting (worker_absent's look)
    MIGRATION_JOB_COUNTS,  # job_counts (+ its triggers), jobs_waiting_since
    MIGRATION_PUSH,  # the parked calls' NOTIFY triggers (coordd.store.postgres.push_sql)
    MIGRATION_CLAIM_WAKE,  # the parked claims' NOTIFY triggers (push_sql: role and kind)
)
SCHEMA_VERSION = len(MIGRATIONS)

TABLES = ("workers", "artifacts", "jobs", "leases", "job_events")  # MIGRATION_CORE's
SQL_TAKEN_TABLES = ("SELECT t FROM unnest($1::text[]) WITH ORDINALITY AS x(t, n) "
                    "WHERE to_regclass(t) IS NOT NULL ORDER BY n")
SQL_TRUNCATE = ("TRUNCATE job_events, leases, jobs, artifacts, workers, "
                "message_reads, messages, agents, job_logs, enrol_tokens, reservations, "
                "job_resources, workflow_edges, workflows, job_limits, limit_holds, "
                "limit_claims, limit_usage, limit_overrides, artifact_chunks, artifact_uploads, "
                "schedules, job_counts RESTART IDENTITY CASCADE")


async def migrate(conn: Any, target: int = SCHEMA_VERSION) -> int:
    """Bring the schema to `target` under `pg_advisory_xact_lock`; return it.

    Args:
        conn: an asyncpg connection (not in a transaction).

    Raises:
        errors.StoreError: the database's schema is newer than this coordd, or the
            database holds tables of coordd's names without a coordd schema version.
    """
    async with conn.transaction():
        await conn.execute(SQL_LOCK, MIGRATION_LOCK_KEY)
        await conn.execute(SQL_VERSION_TABLE)
        version = await conn.fetchval(SQL_VERSION) or 0
        if version == 0:
            taken = [t for (t,) in await conn.fetch(SQL_TAKEN_TABLES, list(TABLES))]
            if taken:
                raise errors.StoreError(
                    f"not a coordd database: it has table(s) {', '.join(taken)} but no "
                    "coordd schema version; give coordd a database (or schema) of its own")
        if version > target:
            raise errors.StoreError(
                f"database schema v{version} is newer than this coordd (v{target})")
        for v in range(version, target):
            await conn.execute(MIGRATIONS[v])
            await conn.execute(SQL_SET_VERSION, v + 1)
    return target
