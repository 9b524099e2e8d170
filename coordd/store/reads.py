"""The read side's SQL (status counts, job rows, listings, workers) and the statements
backup/restore run on a copy of the database. Run by `coordd.store.views` on the read-only
connection and by `coordd.store.sqlite.backup`; nothing here writes the live database.
"""

from __future__ import annotations

from coordd.store.upkeep import SQL_PRUNE_WHERE

# what `prune` would delete, counted up to ?2 rows
SQL_PRUNABLE_CAPPED = "SELECT count(*) FROM (SELECT 1 " + SQL_PRUNE_WHERE + " LIMIT ?2)"
SQL_COUNT_WORKERS = (  # live: a fresh heartbeat and no goodbye since
    "SELECT count(*), coalesce(sum(heartbeat_at >= ? AND offline_at IS NULL), 0) FROM workers")
SQL_COUNT_LEASES = "SELECT count(*) FROM leases"
SQL_JOB_ROW = (
    "SELECT j.job_id, j.kind, j.required_role, j.priority, j.status, j.attempts, "
    "j.max_attempts, j.run_at, j.queued_at, j.created_at, j.updated_at, j.finished_at, "
    "j.payload_json, j.result_json, j.last_error, j.checkpoint_json, j.cancel_requested, "
    "j.idempotency_key, j.max_runtime_s, j.gates_json, "
    "a.sha256, a.size, a.path, "
    "l.worker_id, l.token, l.granted_at, l.expires_at, l.lease_s "
    "FROM jobs j LEFT JOIN leases l ON l.job_id = j.job_id "
    "LEFT JOIN artifacts a ON a.sha256 = j.artifact_sha256 "
)
SQL_GET_JOB = SQL_JOB_ROW + "WHERE j.job_id = ?"
# a job's rowid and which of the JSON columns its view carries hold a value: typeof()
# reads only the record header, so their sizes are then taken by blob handles (JOB_BLOBS)
JOB_BLOBS = ("payload_json", "result_json", "checkpoint_json", "gates_json", "last_error")
SQL_JOB_BLOB_TYPES = ("SELECT rowid, " + ", ".join(f"typeof({c}) IN ('text', 'blob')"
                                                   for c in JOB_BLOBS)
                      + " FROM jobs WHERE job_id = ?")
_LIST_FILTERS = (
    "WHERE (?1 IS NULL OR j.status = ?1) AND (?2 IS NULL OR j.kind = ?2) "
    "AND (?3 IS NULL OR j.required_role = ?3) AND (?4 IS NULL OR j.priority = ?4) "
)
_LIST_AFTER = ("AND (?5 IS NULL OR j.rowid > (SELECT rowid FROM jobs WHERE job_id = ?5)) "
               "ORDER BY j.rowid LIMIT ?6")
_LIST_BEFORE = ("AND (?5 IS NULL OR j.rowid < (SELECT rowid FROM jobs WHERE job_id = ?5)) "
                "ORDER BY j.rowid DESC LIMIT ?6")
# oldest first, after the job ?5 (None: from the start)
SQL_LIST_JOBS = SQL_JOB_ROW + _LIST_FILTERS + _LIST_AFTER
# newest first, before the job ?5 (None: from the newest)
SQL_LIST_JOBS_NEWEST = SQL_JOB_ROW + _LIST_FILTERS + _LIST_BEFORE
# The same pages' rowids and JSON columns holding a value (as SQL_JOB_BLOB_TYPES): what
# a page's reply will carry, sized before any row of it is read.
_LIST_BLOB_TYPES = ("SELECT j.rowid, " + ", ".join(f"typeof(j.{c}) IN ('text', 'blob')"
                                                   for c in JOB_BLOBS) + " FROM jobs j ")
SQL_LIST_BLOB_TYPES = _LIST_BLOB_TYPES + _LIST_FILTERS + _LIST_AFTER
SQL_LIST_BLOB_TYPES_NEWEST = _LIST_BLOB_TYPES + _LIST_FILTERS + _LIST_BEFORE
SQL_JOB_EXISTS = "SELECT 1 FROM jobs WHERE job_id = ?"
# ids in [?1, ?2): ?2 is the prefix followed by U+10FFFF, past any id that starts with it
SQL_JOB_IDS_FROM = (
    "SELECT job_id FROM jobs WHERE job_id >= ?1 AND job_id < ?2 ORDER BY job_id LIMIT ?3")
SQL_EVENTS = (
    "SELECT at, from_status, to_status, worker_id, reason FROM job_events "
    "WHERE job_id = ? ORDER BY event_id"
)
SQL_WORKERS = (
    "SELECT w.worker_id, w.roles_json, w.heartbeat_json, w.heartbeat_at, "
    "(SELECT count(*) FROM leases l WHERE l.worker_id = w.worker_id) "
    "FROM workers w ORDER BY w.worker_id"
)


SQL_COUNT_JOBS = "SELECT count(*) FROM jobs"

# backup and restore: every artifact file the database refers to, and where
SQL_ARTIFACT_REFS = "SELECT sha256, path FROM artifacts"
_CK_LIST = ("CASE WHEN json_valid(j.checkpoint_json) AND json_type(j.checkpoint_json, '$.previous') "
            "= 'array' THEN j.checkpoint_json ELSE '{}' END")
SQL_CHECKPOINT_REFS = (  # (job_id, JSON path of the ref, sha256, path): a record and its `previous`
    "SELECT job_id, '$', json_extract(checkpoint_json, '$.sha256'), "
    "json_extract(checkpoint_json, '$.path') FROM jobs "
    "WHERE json_valid(checkpoint_json) AND json_type(checkpoint_json, '$.sha256') = 'text' "
    "UNION ALL "
    "SELECT j.job_id, p.fullkey, json_extract(p.value, '$.sha256'), json_extract(p.value, '$.path') "
    f"FROM jobs j, json_each({_CK_LIST}, '$.previous') p "
    "WHERE json_type(p.value, '$.sha256') = 'text'"
)
SQL_SET_ARTIFACT_PATH = "UPDATE artifacts SET path = ? WHERE sha256 = ?"
SQL_SET_CHECKPOINT_PATH = (
    "UPDATE jobs SET checkpoint_json = json_set(checkpoint_json, ? || '.path', ?) WHERE job_id = ?"
)
SQL_USER_VERSION = "PRAGMA user_version"  # the schema version (coordd.store.schema)
