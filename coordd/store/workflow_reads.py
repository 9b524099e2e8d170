"""Reads of workflows in the SQLite store: a workflow's row, its nodes and edges as
stored, the list with node counts by status, the id prefixes the web view resolves, and a
job's place in its graph (`node_info`). They run on the read pool
(coordd.store.sqlite.readers); coordd.rules.workflow_views turns the rows into views.
Their plans are pinned as coordd.store.workflows says (tests/unit/test_workflow_plans.py).
"""

from __future__ import annotations

import sqlite3

from coordd.jsontext import dumps


SQL_NODES = (
    "SELECT j.job_id, j.node, j.status, j.kind, j.required_role, j.attempts, j.max_attempts, "
    "j.result_json, j.last_error, a.sha256, a.size, a.path "
    "FROM jobs j INDEXED BY jobs_workflow LEFT JOIN artifacts a ON a.sha256 = j.artifact_sha256 "
    "WHERE j.workflow_id = ? ORDER BY j.rowid"
)
SQL_EDGES = (
    "SELECT e.job_id, e.dep_job_id, e.policy FROM jobs j INDEXED BY jobs_workflow "
    "CROSS JOIN workflow_edges e NOT INDEXED ON e.job_id = j.job_id WHERE j.workflow_id = ?"
)
SQL_GET_WORKFLOW = (
    "SELECT workflow_id, name, status, idempotency_key, schedule_id, created_at, updated_at, "
    "finished_at, summary_json FROM workflows WHERE workflow_id = ?"
)
SQL_WORKFLOW_EXISTS = "SELECT 1 FROM workflows WHERE workflow_id = ?"
# ids in [?1, ?2): ?2 is the prefix followed by U+10FFFF (coordd.store.views.resolve_prefix)
SQL_WORKFLOW_IDS_FROM = (
    "SELECT workflow_id FROM workflows WHERE workflow_id >= ?1 AND workflow_id < ?2 "
    "ORDER BY workflow_id LIMIT ?3")
SQL_LIST_WORKFLOWS = (
    "SELECT workflow_id, name, status, idempotency_key, schedule_id, created_at, updated_at, "
    "finished_at, summary_json FROM workflows WHERE (?1 IS NULL OR status = ?1) "
    "ORDER BY created_at DESC, rowid DESC LIMIT ?2"
)
SQL_WORKFLOW_COUNTS = (
    "SELECT workflow_id, status, count(*) FROM jobs INDEXED BY jobs_workflow WHERE workflow_id IN "
    "(SELECT value FROM json_each(?)) GROUP BY workflow_id, status"
)


def workflow_row(conn: sqlite3.Connection, workflow_id: str) -> tuple | None:
    return conn.execute(SQL_GET_WORKFLOW, (workflow_id,)).fetchone()


def workflow_rows(conn: sqlite3.Connection, status: str | None, limit: int) -> list[tuple]:
    return conn.execute(SQL_LIST_WORKFLOWS, (status, limit)).fetchall()


def workflow_counts(conn: sqlite3.Connection, ids: list[str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for wid, status, n in conn.execute(SQL_WORKFLOW_COUNTS, (dumps(ids),)):
        out.setdefault(wid, {})[status] = n
    return out


def node_rows(conn: sqlite3.Connection, workflow_id: str) -> tuple[list[tuple], list[tuple]]:
    """(nodes, edges) of a workflow as stored."""
    return (conn.execute(SQL_NODES, (workflow_id,)).fetchall(),
            conn.execute(SQL_EDGES, (workflow_id,)).fetchall())


SQL_JOB_NODE = "SELECT workflow_id, node, result_schema FROM jobs WHERE job_id = ?"
SQL_JOB_DEPS = (
    "SELECT d.node, d.status, e.policy FROM workflow_edges e NOT INDEXED "
    "CROSS JOIN jobs d ON d.job_id = e.dep_job_id WHERE e.job_id = ? ORDER BY d.rowid"
)


def node_info(conn: sqlite3.Connection, job_id: str
              ) -> tuple[str | None, str | None, str | None, list[tuple[str, str, str]]]:
    """(workflow_id, node name, result schema, [(dependency, its status, policy)]) of a job."""
    row = conn.execute(SQL_JOB_NODE, (job_id,)).fetchone() or (None, None, None)
    deps = conn.execute(SQL_JOB_DEPS, (job_id,)).fetchall() if row[0] else []
    return row[0], row[1], row[2], deps
