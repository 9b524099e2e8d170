"""Schema v5 (workflows, issue 8): workflows, workflow edges, schedules; jobs gain
`blocked` and `skipped`.

Kept apart from coordd.store.workflows so coordd.store can list it in MIGRATIONS without
an import cycle. The jobs table is rebuilt (SQLite's 12-step procedure: new table, copy,
drop, rename, indexes) because its status CHECK constraint changes; every index of jobs
is recreated exactly as v1..v3 left it (the claim index with its v3 columns and partial
condition). It runs with foreign keys off so that dropping
the old table does not cascade into leases: `migrate` sees the marker on the first line,
and runs `foreign_key_check` before it commits.
"""

FK_OFF_MARKER = "-- foreign_keys=off"  # first line of a migration that rebuilds a table

MIGRATION = """
    -- foreign_keys=off
    CREATE TABLE workflows (
        workflow_id     TEXT PRIMARY KEY,
        name            TEXT NOT NULL,
        status          TEXT NOT NULL CHECK (status IN
                          ('running','succeeded','partial','failed','cancelled')),
        idempotency_key TEXT UNIQUE,
        schedule_id     TEXT,
        created_at      REAL NOT NULL,
        updated_at      REAL NOT NULL,
        finished_at     REAL,
        summary_json    TEXT
    );
    CREATE INDEX workflows_status ON workflows (status, created_at);
    CREATE TABLE jobs_v5 (
        job_id           TEXT PRIMARY KEY,
        kind             TEXT NOT NULL,
        required_role    TEXT NOT NULL,
        priority         INTEGER NOT NULL CHECK (priority BETWEEN 0 AND 3),
        payload_json     TEXT NOT NULL,
        status           TEXT NOT NULL CHECK (status IN
                           ('blocked','waiting','running','succeeded','failed','cancelled',
                            'skipped')),
        attempts         INTEGER NOT NULL DEFAULT 0,
        max_attempts     INTEGER NOT NULL CHECK (max_attempts >= 1),
        run_at           REAL NOT NULL,
        queued_at        REAL NOT NULL,
        created_at       REAL NOT NULL,
        updated_at       REAL NOT NULL,
        finished_at      REAL,
        result_json      TEXT,
        artifact_sha256  TEXT REFERENCES artifacts(sha256),
        last_error       TEXT,
        checkpoint_json  TEXT,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        idempotency_key  TEXT UNIQUE,
        max_runtime_s    REAL,
        gates_json       TEXT,
        last_token       INTEGER NOT NULL DEFAULT 0,
        workflow_id      TEXT REFERENCES workflows(workflow_id),
        node             TEXT,
        result_schema    TEXT
    );
    INSERT INTO jobs_v5 (job_id, kind, required_role, priority, payload_json, status,
        attempts, max_attempts, run_at, queued_at, created_at, updated_at, finished_at,
        result_json, artifact_sha256, last_error, checkpoint_json, cancel_requested,
        idempotency_key, max_runtime_s, gates_json, last_token)
    SELECT job_id, kind, required_role, priority, payload_json, status,
        attempts, max_attempts, run_at, queued_at, created_at, updated_at, finished_at,
        result_json, artifact_sha256, last_error, checkpoint_json, cancel_requested,
        idempotency_key, max_runtime_s, gates_json, last_token FROM jobs;
    DROP TABLE jobs;
    ALTER TABLE jobs_v5 RENAME TO jobs;
    CREATE INDEX jobs_claim ON jobs (priority, queued_at, job_id, run_at, required_role,
        kind, status, gates_json) WHERE status = 'waiting';
    CREATE INDEX jobs_status ON jobs (status, updated_at);
    CREATE INDEX jobs_finished ON jobs (finished_at, status, job_id)
        WHERE finished_at IS NOT NULL;
    CREATE INDEX jobs_artifact ON jobs (artifact_sha256) WHERE artifact_sha256 IS NOT NULL;
    CREATE UNIQUE INDEX jobs_workflow ON jobs (workflow_id, node) WHERE workflow_id IS NOT NULL;
    CREATE INDEX jobs_workflow_waiting ON jobs (queued_at, run_at, required_role)
        WHERE status = 'waiting' AND workflow_id IS NOT NULL;
    CREATE TABLE workflow_edges (
        job_id     TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
        dep_job_id TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
        policy     TEXT NOT NULL CHECK (policy IN ('skip','run')),
        PRIMARY KEY (job_id, dep_job_id)
    ) WITHOUT ROWID;
    CREATE INDEX workflow_edges_dep ON workflow_edges (dep_job_id);
    CREATE TABLE schedules (
        schedule_id TEXT PRIMARY KEY,
        name        TEXT NOT NULL UNIQUE,
        cron        TEXT NOT NULL,
        spec_json   TEXT NOT NULL,
        next_at     REAL NOT NULL,
        last_slot   REAL,
        fired       INTEGER NOT NULL DEFAULT 0,
        created_at  REAL NOT NULL,
        updated_at  REAL NOT NULL
    );
    CREATE INDEX schedules_due ON schedules (next_at)
"""

# v6: a workflow remembers a hash of the graph it was submitted with, so that a repeated
# idempotency key with another graph is refused instead of answered with the first one
# (rows from v5 have none, and are not checked).
MIGRATION_V6 = """
    ALTER TABLE workflows ADD COLUMN spec_sha256 TEXT
"""
