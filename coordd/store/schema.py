"""The schema: coordd's tables and indexes as migrations keyed on PRAGMA user_version,
the connection PRAGMAs, and `migrate`.

A migration is one entry of MIGRATIONS, never edited once released; a new one goes last
and raises SCHEMA_VERSION. A migration is a script of statements, or a function of the
connection where a step needs Python (run in the same transaction). A migration that
rebuilds a table starts with FK_OFF_MARKER.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from coordd import errors
from coordd.store import enrol as _enrol
from coordd.store import governance as _governance_schema
from coordd.store import limits as _limits
from coordd.store import resources as _resources_schema
from coordd.store import logs as _logs
from coordd.store import job_requests as _job_requests
from coordd.store import claim_index as _claim_index
from coordd.store import counters as _counters
from coordd.store import job_changes as _job_changes
from coordd.store import latency as _latency
from coordd.store import messages as _messages
from coordd.store import worker_schema as _worker_schema
from coordd.store import workflow_schema as _workflow_schema
from coordd.store.workflow_schema import FK_OFF_MARKER

SCHEMA_VERSION = 21
PRAGMA_AUTO_VACUUM = "PRAGMA auto_vacuum = INCREMENTAL"
PRAGMAS_WRITER = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA foreign_keys=ON",
    # The writer's SAVEPOINTs keep a sub-journal of the pages each request
    # changes; in memory, not in a temp file (enqueue_batch 37k -> 57k jobs/s, issue 6).
    "PRAGMA temp_store=MEMORY",
)
PRAGMA_CHECKPOINT_TRUNCATE = "PRAGMA wal_checkpoint(TRUNCATE)"
PRAGMA_JOURNAL_SIZE_LIMIT = "PRAGMA journal_size_limit = {:d}"  # a burst's WAL shrinks back
PRAGMA_WAL_AUTOCHECKPOINT = "PRAGMA wal_autocheckpoint = {:d}"  # pages of WAL per checkpoint
PRAGMA_QUICK_CHECK = "PRAGMA quick_check"
PRAGMA_FOREIGN_KEY_CHECK = "PRAGMA foreign_key_check"

# v20: leases rebuilt WITHOUT ROWID, the same columns in the same order. A lease was a
# rowid row plus its job_id primary-key index: two B-trees written by every claim and every
# report, besides leases_expiry and leases_worker; now the row lives in the job_id B-tree.
# The rebuild drops the limits' release trigger with the old table: it is made again here,
# so the file is whole without a start (which drops it while no limit is defined and no
# unit is held, coordd.store.limits).
MIGRATION_LEASES_WITHOUT_ROWID = FK_OFF_MARKER + """
    CREATE TABLE leases_v20 (
        job_id         TEXT NOT NULL PRIMARY KEY REFERENCES jobs(job_id) ON DELETE CASCADE,
        worker_id      TEXT NOT NULL,
        token          INTEGER NOT NULL,
        claim_id       TEXT,
        granted_at     REAL NOT NULL,
        expires_at     REAL NOT NULL,
        lease_s        REAL NOT NULL,
        suspended_at   REAL,
        suspend_reason TEXT,
        gate_open_at   REAL,
        vacate_reason  TEXT,
        gpu_ids        TEXT,
        vram_mb        INTEGER,
        ram_mb         INTEGER,
        resume_at      REAL
    ) WITHOUT ROWID;
    INSERT INTO leases_v20 SELECT job_id, worker_id, token, claim_id, granted_at,
        expires_at, lease_s, suspended_at, suspend_reason, gate_open_at, vacate_reason,
        gpu_ids, vram_mb, ram_mb, resume_at FROM leases;
    DROP TABLE leases;
    ALTER TABLE leases_v20 RENAME TO leases;
    CREATE INDEX leases_expiry ON leases (expires_at);
    CREATE INDEX leases_worker ON leases (worker_id);
    CREATE UNIQUE INDEX leases_claim_id ON leases (worker_id, claim_id)
        WHERE claim_id IS NOT NULL;
""" + ";" + _limits.SQL_RELEASE_TRIGGER

# v21: the jobs table's status CHECK as ORs of equalities. SQLite evaluates a constant IN
# list of more than two terms through an ephemeral index it builds and fills on every
# execution: each UPDATE that sets `status` (two a job) paid for one. The constraint text
# is edited in place (https://sqlite.org/lang_altertable.html, "making other kinds of
# table schema changes": a CHECK constraint may be changed this way, the rows are not
# touched), so the migration takes the same time at any number of jobs.
JOBS_STATUS_CHECK_IN = """CHECK (status IN
                           ('blocked','waiting','running','succeeded','failed','cancelled',
                            'skipped'))"""
JOBS_STATUS_CHECK_OR = (
    "CHECK (status = 'blocked' OR status = 'waiting' OR status = 'running' OR "
    "status = 'succeeded' OR status = 'failed' OR status = 'cancelled' OR "
    "status = 'skipped')"
)
SQL_JOBS_TABLE_SQL = "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'jobs'"
SQL_SET_JOBS_TABLE_SQL = "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'jobs'"


def migrate_jobs_status_check(conn: sqlite3.Connection) -> None:
    """v21, inside `migrate`'s transaction: the jobs status CHECK from IN to ORs (the same
    rule) in the stored CREATE TABLE text, and the schema cookie raised so every connection
    parses it again. A table text that does not hold the v5 constraint exactly once, or a
    SQLite that refuses to write the schema table (SQLITE_DBCONFIG_DEFENSIVE), keeps the
    IN list: the same rule, a little slower."""
    sql = conn.execute(SQL_JOBS_TABLE_SQL).fetchone()[0]
    if sql.count(JOBS_STATUS_CHECK_IN) != 1:
        return
    cookie = conn.execute("PRAGMA schema_version").fetchone()[0]
    conn.execute("PRAGMA writable_schema = ON")
    try:
        conn.execute(SQL_SET_JOBS_TABLE_SQL,
                     (sql.replace(JOBS_STATUS_CHECK_IN, JOBS_STATUS_CHECK_OR),))
    except sqlite3.DatabaseError:  # the schema table is read-only here: nothing changed
        return
    finally:
        conn.execute("PRAGMA writable_schema = OFF")
    conn.execute(f"PRAGMA schema_version = {int(cookie) + 1}")


Migration = str | Callable[[sqlite3.Connection], None]  # a script, or a step in Python

MIGRATIONS: tuple[Migration, ...] = (
    # v1
    """
    CREATE TABLE workers (
        worker_id      TEXT PRIMARY KEY,
        roles_json     TEXT NOT NULL,
        heartbeat_json TEXT NOT NULL,
        heartbeat_at   REAL NOT NULL,
        first_seen_at  REAL NOT NULL
    );
    CREATE TABLE jobs (
        job_id           TEXT PRIMARY KEY,
        kind             TEXT NOT NULL,
        required_role    TEXT NOT NULL,
        priority         INTEGER NOT NULL CHECK (priority BETWEEN 0 AND 3),
        payload_json     TEXT NOT NULL,
        status           TEXT NOT NULL CHECK (status IN
                           ('waiting','running','succeeded','failed','cancelled')),
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
        last_token       INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_claim ON jobs (priority, queued_at) WHERE status = 'waiting';
    CREATE INDEX jobs_status ON jobs (status, updated_at);
    CREATE TABLE leases (
        job_id     TEXT PRIMARY KEY REFERENCES jobs(job_id) ON DELETE CASCADE,
        worker_id  TEXT NOT NULL,
        token      INTEGER NOT NULL,
        claim_id   TEXT,
        granted_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        lease_s    REAL NOT NULL
    );
    CREATE INDEX leases_expiry ON leases (expires_at);
    CREATE INDEX leases_worker ON leases (worker_id);
    CREATE UNIQUE INDEX leases_claim_id ON leases (worker_id, claim_id)
        WHERE claim_id IS NOT NULL;
    CREATE TABLE job_events (
        event_id    INTEGER PRIMARY KEY,
        job_id      TEXT NOT NULL,
        at          REAL NOT NULL,
        worker_id   TEXT,
        from_status TEXT,
        to_status   TEXT NOT NULL,
        reason      TEXT
    );
    CREATE INDEX job_events_job ON job_events (job_id, event_id);
    CREATE TABLE artifacts (
        sha256     TEXT PRIMARY KEY,
        path       TEXT NOT NULL,
        size       INTEGER NOT NULL,
        created_at REAL NOT NULL
    );
    """,
    # v2: the claim index covers every column candidate selection reads, so a claim never
    # touches a job row (nor walks the overflow pages of a large payload) until it takes
    # the job; terminal jobs are found for pruning by their finish time; artifact rows by
    # the jobs that reference them (the foreign key check on delete needs that index too).
    """
    DROP INDEX jobs_claim;
    CREATE INDEX jobs_claim ON jobs (priority, queued_at, run_at, required_role, kind,
        status, job_id, gates_json) WHERE status = 'waiting';
    CREATE INDEX jobs_finished ON jobs (finished_at, status, job_id)
        WHERE finished_at IS NOT NULL;
    CREATE INDEX jobs_artifact ON jobs (artifact_sha256) WHERE artifact_sha256 IS NOT NULL;
    """,
    # v3: FIFO among jobs queued at the same instant (one enqueue_batch, one fake-clock
    # second) is by job id, which is time-ordered (see `coordd.ids.JobIds`); with the
    # id right after queued_at the claim walk is the index order and never sorts ties
    # (v2 ordered ties by rowid: a temp B-tree over every tie, 500 rows per claim after
    # a 500-job batch).
    """
    DROP INDEX jobs_claim;
    CREATE INDEX jobs_claim ON jobs (priority, queued_at, job_id, run_at, required_role,
        kind, status, gates_json) WHERE status = 'waiting';
    """,
    # v4: the agent message hub (messages, per-reader delivery state, agent status)
    _messages.MIGRATION,
    # v5: workflows, edges, schedules; jobs gain `blocked` and `skipped` (a table rebuild)
    _workflow_schema.MIGRATION,
    # v6: workflows.spec_sha256 (a repeated idempotency key must bring the same graph)
    _workflow_schema.MIGRATION_V6,
    # v7: worker incarnations, kinds, goodbyes; jobs.preemptions (issue 14)
    _worker_schema.MIGRATION_WORKER_STATE,
    # v8: job_logs, a job's captured model output (coordd.store.logs)
    _logs.MIGRATION,
    # v9: jobs.request_sha256 (a repeated idempotency key must bring the same request)
    _job_requests.MIGRATION_JOB_REQUEST_SHA256,
    # v10: job counters by (status, priority), kept by triggers (`status` in O(1))
    _counters.MIGRATION,
    # v11: the claim index led by (required_role, kind): flat in jobs a worker cannot take
    _claim_index.MIGRATION,
    # v12: a lease's suspension and vacate state, preemption reservations (issue 16)
    _governance_schema.MIGRATION_GOVERNANCE + ";" + _governance_schema.MIGRATION_RESERVATIONS,
    _resources_schema.MIGRATION_RESOURCES,  # v13: resource requests, lease grants (issue 16)
    _limits.MIGRATION_LIMITS,  # v14: fleet-wide limits (issue 17, coordd.store.limits)
    # v15: job_counts kept by the writer (coordd.store.sqlite.job_changes), its triggers dropped
    _job_changes.MIGRATION_COUNTERS_BY_WRITER,
    _enrol.MIGRATION_ENROL_TOKENS,  # v16: one-time enrolment tokens, hashed (issue 18)
    # v17: waiting jobs by ready time, max(queued_at, run_at): `status` queue latency
    _latency.MIGRATION_READY_INDEX,
    # v18: the job counters in one row the writer rewrites once a batch (job_counts: a view)
    _job_changes.MIGRATION_COUNTERS_ONE_ROW,
    _governance_schema.MIGRATION_RESUME_AT,  # v19: leases.resume_at (a pending resume)
    # v20: leases keyed by job_id alone (WITHOUT ROWID): one B-tree fewer to write a lease
    MIGRATION_LEASES_WITHOUT_ROWID,
    # v21: the jobs status CHECK without an IN list (an ephemeral index per status write)
    migrate_jobs_status_check,
)


SQL_COUNT_TABLES = "SELECT count(*) FROM sqlite_master WHERE type='table'"


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Bring the schema to `target` (keyed on PRAGMA user_version); return it.

    Raises:
        errors.StoreError: the file is from a newer coordd, or is not a coordd database.
    """
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > target:
        raise errors.schema_too_new(version, target)
    if version == 0:
        tables = conn.execute(SQL_COUNT_TABLES).fetchone()[0]
        if tables:
            raise errors.StoreError("database has tables but no coordd schema version")
    for v in range(version, target):
        step = MIGRATIONS[v]
        # a rebuild runs with foreign keys off: no cascade on DROP
        rebuild = isinstance(step, str) and step.lstrip().startswith(FK_OFF_MARKER)
        fk_was = conn.execute("PRAGMA foreign_keys").fetchone()[0]
        conn.execute(f"PRAGMA foreign_keys={0 if rebuild else fk_was}")  # outside the txn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if isinstance(step, str):
                for stmt in _split(step):
                    conn.execute(stmt)
            else:
                step(conn)
            if rebuild and conn.execute(PRAGMA_FOREIGN_KEY_CHECK).fetchone() is not None:
                raise errors.StoreError(f"migration to v{v + 1} broke a foreign key")
            conn.execute(f"PRAGMA user_version = {v + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        finally:
            conn.execute(f"PRAGMA foreign_keys={fk_was}")
    if version < target and conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
        # the migrations' pages go into the file and the WAL starts empty: a new file's
        # WAL would otherwise keep the ~650 KiB its tables took (the disk-full refusals
        # count on a WAL that grows with what is written)
        conn.execute(PRAGMA_CHECKPOINT_TRUNCATE)
    return target


def prepare_new_file(conn: sqlite3.Connection) -> bool:
    """Give a file without tables incremental auto-vacuum; return True if it was new.

    Must run before `PRAGMA journal_mode=WAL` and before the first table: SQLite fixes
    the auto-vacuum mode then. An older file keeps its mode (`vacuum_step` frees nothing
    there; a one-off `VACUUM` converts it).
    """
    if conn.execute(SQL_COUNT_TABLES).fetchone()[0]:
        return False
    conn.execute(PRAGMA_AUTO_VACUUM)
    return True


def _split(script: str) -> list[str]:
    """The statements of `script`; a `;` inside a statement (a trigger's body) stays."""
    out: list[str] = []
    buf = ""
    for piece in script.split(";"):
        buf += piece + ";"
        if sqlite3.complete_statement(buf):
            if buf.strip(" \n\t;"):
                out.append(buf.strip()[:-1].strip())
            buf = ""
    if buf.strip(" \n\t;"):
        out.append(buf.strip().rstrip(";").strip())
    return out
