"""SQL of the web view's read-only methods (issue 19): filtered job pages, finished-job
rates, live leases and reservations, workflow node runs, the hub's message log.

Runs on the read-only connections (coordd.store.sqlite.readers). Every statement is bounded: a
job page looks at a window of at most `scan` jobs by rowid (job ids are time-ordered, so rowid
order is enqueue order), the rates at most EVENTS_SCAN_MAX events; no new index is needed, so
the writer's hot path pays nothing for this view.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from coordd.store.counters import SQL_COUNTS

EVENTS_SCAN_MAX = 100000  # newest events `job_stats` looks at
ROWID_END = (1 << 63) - 1  # past every rowid: `rowid < coalesce(?, END)` stays a range seek
TIME_END = "9e18"  # past every updated_at, likewise

_ROW_COLUMNS = (
    "j.job_id, j.kind, j.required_role, j.priority, j.status, j.attempts, j.max_attempts, "
    "j.created_at, j.updated_at, j.run_at, j.last_error, l.worker_id, l.expires_at, "
    "j.workflow_id, j.node"
)
_FILTERS = (
    "(?1 IS NULL OR j.status = ?1) AND (?2 IS NULL OR j.kind = ?2) "
    "AND (?3 IS NULL OR j.required_role = ?3) AND (?4 IS NULL OR j.priority = ?4) "
    "AND (?5 IS NULL OR EXISTS (SELECT 1 FROM job_events e WHERE e.job_id = j.job_id "
    "AND e.worker_id = ?5)) "
    "AND (?6 IS NULL OR j.workflow_id = ?6) "
    "AND (?7 IS NULL OR instr(lower(j.payload_json), ?7) > 0 "
    "OR instr(lower(coalesce(j.last_error, '')), ?7) > 0)"
)
# the window: at most ?9 jobs, newest first, before rowid ?8 (None: from the newest)
_WINDOW = (
    f"(SELECT rowid AS r FROM jobs WHERE rowid < coalesce(?8, {ROWID_END}) "
    "ORDER BY rowid DESC LIMIT ?9) w JOIN jobs j ON j.rowid = w.r "
)
# with a status: at most ?9 jobs of status ?1 by last change, newest first, before the
# cursor (updated_at ?11, rowid ?8): the jobs_status index, (status, updated_at, rowid)
_STATUS_WINDOW = (
    "(SELECT rowid AS r, updated_at AS u FROM jobs INDEXED BY jobs_status WHERE status = ?1 "
    f"AND (updated_at, rowid) < (coalesce(?11, {TIME_END}), coalesce(?8, {ROWID_END})) "
    "ORDER BY updated_at DESC, rowid DESC LIMIT ?9) w JOIN jobs j ON j.rowid = w.r "
)
SQL_STATUS_MATCHES = (
    f"SELECT j.rowid FROM {_STATUS_WINDOW}WHERE {_FILTERS} "
    "ORDER BY w.u DESC, w.r DESC LIMIT ?10"
)
SQL_STATUS_WINDOW_END = (
    "SELECT job_id FROM jobs INDEXED BY jobs_status WHERE status = ?1 "
    f"AND (updated_at, rowid) < (coalesce(?2, {TIME_END}), coalesce(?3, {ROWID_END})) "
    "ORDER BY updated_at DESC, rowid DESC LIMIT 1 OFFSET ?4"
)
SQL_CURSOR_OF = "SELECT rowid, updated_at FROM jobs WHERE job_id = ?"
SQL_MATCHES = (  # rowids of up to ?10 matches in the window, newest first (one scan)
    f"SELECT j.rowid FROM {_WINDOW}WHERE {_FILTERS} ORDER BY j.rowid DESC LIMIT ?10"
)
# one workflow's jobs by the jobs_workflow index (no window: a workflow is small)
SQL_WORKFLOW_MATCHES = (
    f"SELECT j.rowid FROM jobs j WHERE j.workflow_id = ?6 AND {_FILTERS} "
    f"AND j.rowid < coalesce(?8, {ROWID_END}) AND ?9 > 0 ORDER BY j.rowid DESC LIMIT ?10"
)
SQL_ROWS = (  # the page's rows, by rowid (a JSON array), then the rowid
    f"SELECT {_ROW_COLUMNS}, j.rowid FROM jobs j LEFT JOIN leases l ON l.job_id = j.job_id "
    "WHERE j.rowid IN (SELECT value FROM json_each(?))"
)
SQL_WINDOW_END = (  # the oldest job of the window (None: the window reaches the first job)
    f"SELECT job_id FROM jobs WHERE rowid < coalesce(?1, {ROWID_END}) ORDER BY rowid DESC "
    "LIMIT 1 OFFSET ?2"
)

# jobs that ended, per bucket of ?2 s since ?1, among the newest ?3 events: each job once,
# at its last terminal event (an end a later event left again, a retry, is not counted: a
# job retried by hand and failed again is one failed job; a retryable failure is running
# -> waiting and never an end). The probe is the job_events_job index, per terminal event.
SQL_RATES = (
    "SELECT CAST((e.at - ?1) / ?2 AS INTEGER), e.to_status, count(*) FROM "
    "(SELECT event_id, job_id, at, to_status FROM job_events ORDER BY event_id DESC "
    "LIMIT ?3) e WHERE e.at >= ?1 "
    "AND e.to_status IN ('succeeded', 'failed', 'cancelled', 'skipped') "
    "AND NOT EXISTS (SELECT 1 FROM job_events r WHERE r.job_id = e.job_id "
    "AND r.event_id > e.event_id AND r.from_status = e.to_status) GROUP BY 1, 2"
)
SQL_RATES_SCANNED = (
    "SELECT count(*) FROM (SELECT at FROM job_events ORDER BY event_id DESC LIMIT ?2) "
    "WHERE at >= ?1"
)
SQL_HELD = (
    "SELECT l.worker_id, l.job_id, j.kind, j.priority, l.granted_at, l.expires_at "
    "FROM leases l JOIN jobs j ON j.job_id = l.job_id ORDER BY l.worker_id, l.expires_at"
)
SQL_RESERVATIONS = (
    "SELECT worker_id, job_id, victim_job_id, expires_at FROM reservations "
    "WHERE expires_at > ? ORDER BY worker_id"
)
SQL_WORKFLOW_EVENTS = (  # every event of the workflow's jobs, in order
    "SELECT j.node, e.job_id, e.at, e.worker_id, e.from_status, e.to_status "
    "FROM jobs j JOIN job_events e ON e.job_id = j.job_id "
    "WHERE j.workflow_id = ? ORDER BY e.event_id"
)
SQL_MESSAGES = (
    "SELECT message_id, sender, recipient, message_type, priority, status, created_at, "
    "processed_at, expires_at, substr(content, 1, 200) FROM messages "
    "WHERE (?1 IS NULL OR rowid < (SELECT rowid FROM messages WHERE message_id = ?1)) "
    "ORDER BY rowid DESC LIMIT ?2"
)
SQL_MESSAGE_EXISTS = "SELECT 1 FROM messages WHERE message_id = ?"
SQL_DELIVERIES = (
    "SELECT message_id, reader, deliveries, delivered_at, visible_at, processed_at "
    "FROM message_reads WHERE message_id IN (SELECT value FROM json_each(?)) "
    "ORDER BY delivered_at"
)


Cursor = tuple[int, float]  # (rowid, updated_at) of the job a page continues after


def cursor_of(conn: sqlite3.Connection, job_id: str) -> Cursor | None:
    """The page cursor of a job (None: no such job)."""
    row = conn.execute(SQL_CURSOR_OF, (job_id,)).fetchone()
    return None if row is None else (row[0], row[1])


def matches(conn: sqlite3.Connection, filters: tuple[Any, ...], cursor: Cursor | None,
            scan: int, cap: int) -> list[int]:
    """Rowids of up to `cap` jobs matching `filters` (status, kind, role, priority,
    worker, workflow_id, lower-cased text) in one pass over a window of `scan` jobs
    after `cursor`: with a status, that status's jobs by last change (the jobs_status
    index); without one, every job by enqueue order; a workflow's jobs by its index.
    Newest first: the same pass pages and counts."""
    rowid, updated = cursor if cursor is not None else (None, None)
    args = (*filters, rowid, scan, cap, updated)
    if filters[5] is not None:
        return [r[0] for r in conn.execute(SQL_WORKFLOW_MATCHES, args[:10])]
    if filters[0] is not None:
        return [r[0] for r in conn.execute(SQL_STATUS_MATCHES, args)]
    return [r[0] for r in conn.execute(SQL_MATCHES, args[:10])]


def rows(conn: sqlite3.Connection, rowids: list[int]) -> list[tuple[Any, ...]]:
    """JobRow's fields of these jobs, in the order of `rowids`."""
    got = {r[-1]: r[:-1] for r in conn.execute(SQL_ROWS, (json.dumps(rowids),))}
    return [got[r] for r in rowids if r in got]


def window_end(conn: sqlite3.Connection, status: str | None, cursor: Cursor | None,
               scan: int) -> str | None:
    """The job id where a window of `scan` jobs after `cursor` stops (None: it reaches
    the oldest job, so there is no further page)."""
    def at(cur: Cursor | None, offset: int) -> Any:
        rowid, updated = cur if cur is not None else (None, None)
        if status is not None:
            return conn.execute(SQL_STATUS_WINDOW_END, (status, updated, rowid, offset)
                                ).fetchone()
        return conn.execute(SQL_WINDOW_END, (rowid, offset)).fetchone()
    row = at(cursor, scan - 1)
    if row is None:
        return None
    return row[0] if at(cursor_of(conn, row[0]), 0) is not None else None


def counts(conn: sqlite3.Connection) -> list[tuple[str, int, int]]:
    """(status, priority, n) from the counters the writer's triggers keep."""
    return conn.execute(SQL_COUNTS).fetchall()


def rates(conn: sqlite3.Connection, since: float, bucket_s: float
          ) -> tuple[list[tuple[int, str, int]], int]:
    """((bucket index, terminal to_status, n) of the jobs that ended since `since`, each
    job at its last terminal event; events looked at)."""
    rows = conn.execute(SQL_RATES, (since, bucket_s, EVENTS_SCAN_MAX)).fetchall()
    scanned = conn.execute(SQL_RATES_SCANNED, (since, EVENTS_SCAN_MAX)).fetchone()[0]
    return rows, scanned


def held(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
    """(worker_id, job_id, kind, priority, granted_at, expires_at) of every lease."""
    return conn.execute(SQL_HELD).fetchall()


def reservations(conn: sqlite3.Connection, now: float) -> list[tuple[Any, ...]]:
    """(worker_id, job_id, victim_job_id, expires_at) of live reservations."""
    return conn.execute(SQL_RESERVATIONS, (now,)).fetchall()


def workflow_events(conn: sqlite3.Connection, workflow_id: str) -> list[tuple[Any, ...]]:
    """(node, job_id, at, worker_id, from_status, to_status) of a workflow's jobs' events."""
    return conn.execute(SQL_WORKFLOW_EVENTS, (workflow_id,)).fetchall()


def messages(conn: sqlite3.Connection, before: str | None, limit: int
             ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(message rows newest first, their delivery rows)."""
    rows = conn.execute(SQL_MESSAGES, (before, limit)).fetchall()
    ids = json.dumps([r[0] for r in rows])
    return rows, conn.execute(SQL_DELIVERIES, (ids,)).fetchall()


def message_exists(conn: sqlite3.Connection, message_id: str) -> bool:
    """Whether a hub message with this id is stored."""
    return conn.execute(SQL_MESSAGE_EXISTS, (message_id,)).fetchone() is not None
