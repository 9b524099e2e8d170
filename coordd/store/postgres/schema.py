"""The PostgreSQL schema: migrations keyed on the `coordd_schema_version` table, run under
a transaction-level advisory lock (two coordd starting together migrate once).

Tables and columns mean what they mean in SQLite (coordd.store.schema): times are Unix
seconds (float8), JSON is stored as text, exactly as coordd encoded it. A migration is one
entry of MIGRATIONS, never edited once released; a new one goes last.
"""

from __future__ import annotations

from typing import Any

from coordd import errors
from coordd.store.postgres.push_sql import (
    MIGRATION_CLAIM_WAKE, MIGRATION_PUSH, MIGRATION_PUSH_CACHED, PUSH_CHANNEL)
from coordd.store.postgres.schema_areas import (
    MIGRATION_ENROL, MIGRATION_GOVERNANCE, MIGRATION_HUB, MIGRATION_LIMITS, MIGRATION_LOGS,
    MIGRATION_WORKFLOWS,
)

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

# One statement-level trigger for every UPDATE of `jobs` in place of two row triggers
# (job_counts_update, push_ended): one PL/pgSQL call a statement, not one to three a job.
# The counters' deltas are summed by shard, status and priority (a row whose status and
# priority did not change adds -1 and +1: nothing). The transition tables of a statement
# hold every row its data-modifying CTEs updated in `jobs` (the trigger fires once).
# Transition tables allow no column list: it fires for any UPDATE of jobs.
MIGRATION_JOBS_UPDATED = f"""
DROP TRIGGER job_counts_update ON jobs;
DROP TRIGGER push_ended ON jobs;
DROP FUNCTION coordd_push_ended();
CREATE FUNCTION coordd_jobs_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_counts AS c (shard, status, priority, n)
    SELECT pg_backend_pid(), x.status, x.priority, sum(x.d)
    FROM (SELECT o.status, o.priority, -1 AS d FROM gone o WHERE o.status <> 'running'
          UNION ALL
          SELECT n.status, n.priority, 1 FROM came n WHERE n.status <> 'running') x
    GROUP BY x.status, x.priority HAVING sum(x.d) <> 0
    ON CONFLICT (shard, status, priority) DO UPDATE SET n = c.n + EXCLUDED.n;
    IF EXISTS (SELECT 1 FROM push_wanted WHERE what = 't'
               AND until > extract(epoch FROM clock_timestamp())) THEN
        PERFORM pg_notify('{PUSH_CHANNEL}', 't' || n.job_id)
        FROM came n JOIN gone o ON o.job_id = n.job_id
        WHERE n.status IN ('succeeded', 'failed', 'cancelled', 'skipped')
          AND o.status IS DISTINCT FROM n.status;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_updated AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS gone NEW TABLE AS came
    FOR EACH STATEMENT EXECUTE FUNCTION coordd_jobs_updated();
"""

# The idempotency key's unique index holds the keyed jobs only: an update of a job that
# is not HOT (a claim, a complete: status is in partial indexes) adds no entry for a NULL
# key. Enqueue's ON CONFLICT names the index's WHERE.
MIGRATION_KEY_PARTIAL = """
CREATE UNIQUE INDEX jobs_idempotency_key ON jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
ALTER TABLE jobs DROP CONSTRAINT jobs_idempotency_key_key;
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
    MIGRATION_PUSH_CACHED,  # the push triggers look push_wanted up with a kept plan
    MIGRATION_JOBS_UPDATED,  # job_counts_update and push_ended: one statement trigger
    MIGRATION_KEY_PARTIAL,  # jobs' idempotency key: a partial unique index (no NULLs)
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
            raise errors.schema_too_new(version, target)
        for v in range(version, target):
            await conn.execute(MIGRATIONS[v])
            await conn.execute(SQL_SET_VERSION, v + 1)
    return target
