"""SQL of the parked calls (issue 15): the writer's wake-up triggers, the event feed, the
worker's pending actions, and the due times of scheduled jobs.

The triggers are TEMP: they live only on the writer's own connection (nothing in the
file changes, no migration) and call `coordd_push(what, job_id, a, b, c)`, a function
the writer registers (coordd.store.sqlite.wakeups: coordd.service.push.Push.note), for every
row that may wake a parked call:

- `c` a running job's cancel was requested, or coordd's governance suspended or told it to
  vacate (a = the lease holder, for `watch_worker`);
- `h` a worker's heartbeat, while claims are parked (job_id = the worker, a = its roles);
- `l` units of a fleet-wide limit freed (a lease that held them ended), while claims are
  parked (a = the limit).

Jobs entering `waiting` (`w`) or a terminal status (`t`) come from the writer's own job
hook instead (coordd.store.sqlite.job_changes), which sees every job row change anyway.

New job events (`watch_events`) need no trigger: the highest event id after a commit says.
The TEMP tables and their statements run on the writer's connection from the event loop,
never inside the writer's transaction (a batch runs without yielding to the loop).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

PUSH_FUNCTION = "coordd_push"

# What the heartbeat triggers look at to decide whether to call at all: `push_on` holds
# 'claims' while a claim is parked (or looking).
TEMP_TABLES = (
    "CREATE TEMP TABLE IF NOT EXISTS push_on (what TEXT PRIMARY KEY)",
)
TRIGGERS = (
    "CREATE TEMP TRIGGER IF NOT EXISTS push_heartbeat_insert AFTER INSERT ON main.workers "
    "WHEN EXISTS (SELECT 1 FROM temp.push_on WHERE what = 'claims') BEGIN "
    "SELECT coordd_push('h', NEW.worker_id, NEW.roles_json, NULL, NULL); END",
    "CREATE TEMP TRIGGER IF NOT EXISTS push_heartbeat_update AFTER UPDATE ON main.workers "
    "WHEN EXISTS (SELECT 1 FROM temp.push_on WHERE what = 'claims') BEGIN "
    "SELECT coordd_push('h', NEW.worker_id, NEW.roles_json, NULL, NULL); END",
    "CREATE TEMP TRIGGER IF NOT EXISTS push_limit_freed AFTER DELETE ON main.limit_holds "
    "WHEN EXISTS (SELECT 1 FROM temp.push_on WHERE what = 'claims') BEGIN "
    "SELECT coordd_push('l', OLD.job_id, OLD.name, NULL, NULL); END",
    "CREATE TEMP TRIGGER IF NOT EXISTS push_cancel AFTER UPDATE OF cancel_requested "
    "ON main.jobs WHEN NEW.cancel_requested = 1 AND OLD.cancel_requested = 0 BEGIN "
    "SELECT coordd_push('c', NEW.job_id, "
    "(SELECT worker_id FROM main.leases WHERE job_id = NEW.job_id), NULL, NULL); END",
    "CREATE TEMP TRIGGER IF NOT EXISTS push_governance AFTER UPDATE OF suspended_at, "
    "vacate_reason ON main.leases WHEN (NEW.suspended_at IS NOT NULL AND OLD.suspended_at "
    "IS NULL) OR (NEW.vacate_reason IS NOT NULL AND OLD.vacate_reason IS NULL) BEGIN "
    "SELECT coordd_push('c', NEW.job_id, NEW.worker_id, NULL, NULL); END",
)
SQL_CLAIMS_ON = "INSERT OR IGNORE INTO temp.push_on (what) VALUES ('claims')"
SQL_CLAIMS_OFF = "DELETE FROM temp.push_on WHERE what = 'claims'"

SQL_SCHEDULED = (
    "SELECT run_at, required_role, kind FROM jobs INDEXED BY jobs_claim "
    "WHERE status = 'waiting' AND run_at > ?"
)
SQL_CANCEL_FOR_WORKER = (
    "SELECT l.job_id FROM leases l JOIN jobs j ON j.job_id = l.job_id "
    "WHERE l.worker_id = ? AND j.cancel_requested = 1 ORDER BY l.job_id"
)
# Governance state of a worker's leases (coordd.rules.governance keeps it on the lease row).
SQL_GOVERNED_FOR_WORKER = (
    "SELECT job_id, vacate_reason IS NOT NULL, coalesce(vacate_reason, suspend_reason) "
    "FROM leases WHERE worker_id = ? AND (suspended_at IS NOT NULL OR vacate_reason IS NOT "
    "NULL) ORDER BY job_id"
)
SQL_JOB_STATUS = "SELECT status FROM jobs WHERE job_id = ?"
# The events after a cursor, at most ?2 of them looked at; the filter applies to those.
SQL_FEED = (
    "SELECT e.event_id, e.job_id, e.at, e.worker_id, e.from_status, e.to_status, e.reason, "
    "j.kind, j.workflow_id, j.node FROM "
    "(SELECT * FROM job_events WHERE event_id > ?1 ORDER BY event_id LIMIT ?2) e "
    "LEFT JOIN jobs j ON j.job_id = e.job_id ORDER BY e.event_id"
)
SQL_LAST_EVENT = "SELECT coalesce(max(event_id), 0) FROM job_events"


def install(conn: sqlite3.Connection, note: Callable[[str, str, Any, Any, Any], None]) -> None:
    """Register `note` as coordd_push and create the TEMP tables and triggers on `conn`
    (the writer's).

    `note` must not raise: an error there would fail the write that fired it.
    """
    conn.create_function(PUSH_FUNCTION, 5, note)
    for sql in (*TEMP_TABLES, *TRIGGERS):
        conn.execute(sql)


def claims_parked(conn: sqlite3.Connection, on: bool) -> None:
    """Tell the `waiting` triggers whether a claim is parked (they note every job then)."""
    conn.execute(SQL_CLAIMS_ON if on else SQL_CLAIMS_OFF)


def scheduled(conn: sqlite3.Connection, now: float) -> list[tuple[float, str, str]]:
    """(run_at, role, kind) of every waiting job not yet due at `now`."""
    return conn.execute(SQL_SCHEDULED, (now,)).fetchall()


def cancel_for_worker(conn: sqlite3.Connection, worker_id: str) -> list[str]:
    """Ids of the jobs `worker_id` holds whose cancel was requested."""
    return [r[0] for r in conn.execute(SQL_CANCEL_FOR_WORKER, (worker_id,))]


def governed_for_worker(conn: sqlite3.Connection,
                        worker_id: str) -> list[tuple[str, bool, str | None]]:
    """(job_id, vacate?, reason) of the leases `worker_id` holds that coordd's governance
    has suspended (vacate False) or told to vacate (vacate True)."""
    return [(r[0], bool(r[1]), r[2])
            for r in conn.execute(SQL_GOVERNED_FOR_WORKER, (worker_id,))]


def job_status(conn: sqlite3.Connection, job_id: str) -> str | None:
    """The job's status, or None if there is no such job."""
    row = conn.execute(SQL_JOB_STATUS, (job_id,)).fetchone()
    return None if row is None else row[0]


def feed(conn: sqlite3.Connection, after: int, scan: int) -> list[tuple[Any, ...]]:
    """Up to `scan` events with id > `after`, in id order, with the job's kind, workflow
    and node (None once the job is pruned)."""
    return conn.execute(SQL_FEED, (after, scan)).fetchall()


def last_event(conn: sqlite3.Connection) -> int:
    """The highest event id (0 when there is none)."""
    return conn.execute(SQL_LAST_EVENT).fetchone()[0]
