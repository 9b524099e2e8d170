"""The PostgreSQL schema's migrations for coordd's areas beyond the core (v2-v7 of
coordd.store.postgres.schema.MIGRATIONS): the hub, job logs, enrolment tokens, governance,
workflows and fleet-wide limits. Released migrations: never edited."""

from __future__ import annotations

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

__all__ = ["MIGRATION_ENROL", "MIGRATION_GOVERNANCE", "MIGRATION_HUB", "MIGRATION_LIMITS",
           "MIGRATION_LOGS", "MIGRATION_WORKFLOWS"]
