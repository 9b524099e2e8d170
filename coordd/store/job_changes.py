"""SQL of the writer's job-change hook: one TEMP trigger per kind of row change on `jobs` calls
`coordd_job(...)` (coordd.store.sqlite.job_changes.JobChanges.row), and the statements that keep
the counters (status, priority) -> n from what the hook saw: one row, `job_totals`, read as the
`job_counts` view.

The triggers are TEMP: they live on the writer's connection only, so nothing in the file
runs a trigger program per row any more (the counters' persistent triggers are dropped by
MIGRATION_COUNTERS_BY_WRITER). A job row change made by another connection is not seen:
the writer checks the counters' totals by status at open and recounts when they differ,
and recounts whenever `PRAGMA data_version` says another connection committed
(coordd.store.sqlite.job_changes).
"""

from __future__ import annotations

JOB_FUNCTION = "coordd_job"
JOB_FUNCTION_ARGS = 8  # old status, old priority, new status, new priority, job id,
#                        role, kind, run_at if still ahead (else NULL)

# `NEW.run_at > NEW.updated_at`: the job entered waiting with its run_at still ahead (a
# waiting job's updated_at is when it entered waiting, coordd's `now` then).
_AHEAD = "CASE WHEN NEW.run_at > NEW.updated_at THEN NEW.run_at END"
TRIGGERS = (
    "CREATE TEMP TRIGGER IF NOT EXISTS job_changes_insert AFTER INSERT ON main.jobs BEGIN "
    f"SELECT {JOB_FUNCTION}(NULL, NULL, NEW.status, NEW.priority, NEW.job_id, "
    f"NEW.required_role, NEW.kind, {_AHEAD}); END",
    "CREATE TEMP TRIGGER IF NOT EXISTS job_changes_update AFTER UPDATE OF status, priority "
    "ON main.jobs WHEN OLD.status IS NOT NEW.status OR OLD.priority IS NOT NEW.priority "
    f"BEGIN SELECT {JOB_FUNCTION}(OLD.status, OLD.priority, NEW.status, NEW.priority, "
    f"NEW.job_id, NEW.required_role, NEW.kind, {_AHEAD}); END",
    "CREATE TEMP TRIGGER IF NOT EXISTS job_changes_delete AFTER DELETE ON main.jobs BEGIN "
    f"SELECT {JOB_FUNCTION}(OLD.status, OLD.priority, NULL, NULL, OLD.job_id, NULL, NULL, "
    "NULL); END",
)

# The claim's read of its worker (coordd.store.jobs.SQL_WORKER) is kept by the writer
# (coordd.store.sqlite.job_changes.WorkerRows); a change to those columns of a worker row
# by the writer's connection drops it there. Rows another connection changed: the same
# `PRAGMA data_version` check as the counters.
WORKER_FUNCTION = "coordd_worker"
WORKER_TRIGGERS = (
    "CREATE TEMP TRIGGER IF NOT EXISTS worker_rows_insert AFTER INSERT ON main.workers "
    f"BEGIN SELECT {WORKER_FUNCTION}(NEW.worker_id); END",
    "CREATE TEMP TRIGGER IF NOT EXISTS worker_rows_update AFTER UPDATE OF worker_id, "
    "roles_json, heartbeat_json, heartbeat_at ON main.workers "
    f"BEGIN SELECT {WORKER_FUNCTION}(OLD.worker_id), {WORKER_FUNCTION}(NEW.worker_id); END",
    "CREATE TEMP TRIGGER IF NOT EXISTS worker_rows_delete AFTER DELETE ON main.workers "
    f"BEGIN SELECT {WORKER_FUNCTION}(OLD.worker_id); END",
)

# The counters migration's successor: the writer keeps job_counts (in the batch's
# transaction; since MIGRATION_COUNTERS_ONE_ROW as one row, `job_totals`).
MIGRATION_COUNTERS_BY_WRITER = """
    DROP TRIGGER IF EXISTS jobs_count_insert;
    DROP TRIGGER IF EXISTS jobs_count_delete;
    DROP TRIGGER IF EXISTS jobs_count_update
"""

# The counters in one row (its own migration step, after MIGRATION_COUNTERS_BY_WRITER):
# `job_totals.counts` is a JSON list of [status, priority, n] (n <> 0), rewritten whole
# by one UPDATE per batch that changed a count; `job_counts` becomes a view of it, so
# its readers (status checks, the web view, preemption, the sqlite3 shell) are unchanged.
# Before, the batch's deltas were one upsert per changed (status, priority): two a batch
# on the drain path.
_COUNTS_JSON = (
    "SELECT coalesce(json_group_array(json_array(status, priority, n)), '[]') FROM "
)
MIGRATION_COUNTERS_ONE_ROW = f"""
    CREATE TABLE job_totals (
        id     INTEGER PRIMARY KEY CHECK (id = 1),
        counts TEXT NOT NULL
    );
    INSERT INTO job_totals (id, counts)
        SELECT 1, ({_COUNTS_JSON}job_counts WHERE n <> 0);
    DROP TABLE job_counts;
    CREATE VIEW job_counts (status, priority, n) AS
        SELECT json_extract(c.value, '$[0]'), json_extract(c.value, '$[1]'),
               json_extract(c.value, '$[2]')
        FROM job_totals, json_each(job_totals.counts) AS c
"""
SQL_COUNTS_SET = "UPDATE job_totals SET counts = ? WHERE id = 1"
SQL_RECOUNT = (
    "INSERT OR REPLACE INTO job_totals (id, counts) SELECT 1, (" + _COUNTS_JSON
    + "(SELECT status, priority, count(*) AS n FROM jobs GROUP BY status, priority))",
)
SQL_COUNTS_ALL = "SELECT status, priority, n FROM job_counts"
# Jobs by status off the jobs_status index (~70 ms at 1 M jobs; the full recount, a table
# scan and a sort, ~3 s) against the counters' sums: the check at open.
SQL_STATUS_TOTALS = "SELECT status, count(*) FROM jobs INDEXED BY jobs_status GROUP BY status"
SQL_COUNTED_TOTALS = (
    "SELECT status, sum(n) FROM job_counts GROUP BY status HAVING sum(n) <> 0"
)
SQL_DATA_VERSION = "PRAGMA data_version"
