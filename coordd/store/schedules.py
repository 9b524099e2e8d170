"""Schedules in the SQLite store: a cron and a workflow template per name; `fire_due`
starts one workflow (coordd.store.workflows.insert_workflow) for each slot that has come
and advances the schedule in the same writer transaction, so a slot starts once however
coordd stops. Which outcome a repeated add has is coordd.store.api_schedules.add_outcome
(the same on every store); when slots fall is coordd.rules.cron.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from coordd import errors
from coordd.store.api_schedules import add_outcome
from coordd.store.api_workflows import NewWorkflow
from coordd.store.workflows import insert_workflow


SQL_INSERT_SCHEDULE = (
    "INSERT INTO schedules (schedule_id, name, cron, spec_json, next_at, created_at, "
    "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING "
    "RETURNING schedule_id"
)
SQL_DUE_SCHEDULES = (
    "SELECT schedule_id, name, cron, spec_json, next_at FROM schedules INDEXED BY schedules_due "
    "WHERE next_at <= ? ORDER BY next_at LIMIT ?"
)
SQL_ADVANCE_SCHEDULE = (
    "UPDATE schedules SET next_at = ?, last_slot = ?, fired = fired + 1, updated_at = ? "
    "WHERE schedule_id = ? AND next_at = ?"
)
SQL_LIST_SCHEDULES = (
    "SELECT schedule_id, name, cron, spec_json, next_at, last_slot, fired, created_at "
    "FROM schedules ORDER BY name"
)
SQL_DELETE_SCHEDULE = "DELETE FROM schedules WHERE name = ? OR schedule_id = ?"


SQL_SCHEDULE_BY_NAME = (
    "SELECT schedule_id, cron, spec_json, next_at FROM schedules WHERE name = ?"
)
SQL_REPLACE_SCHEDULE = (
    "UPDATE schedules SET cron = ?, spec_json = ?, next_at = ?, updated_at = ? "
    "WHERE schedule_id = ?"
)


def add_schedule(conn: sqlite3.Connection, now: float, schedule_id: str, name: str,
                 cron: str, spec_json: str, next_at: float, replace: bool = False) -> str:
    """Insert a schedule; return `created`, `unchanged` (this name exists with this very
    cron and workflow: a repeated add) or `replaced` (`replace`: the existing schedule
    takes the new cron and workflow, and keeps its id, count and last slot; its next slot
    stays unless the cron changed): coordd.store.api_schedules.add_outcome.

    Raises:
        errors.InvalidState: the name exists with another cron or workflow, no `replace`.
    """
    if conn.execute(SQL_INSERT_SCHEDULE, (schedule_id, name, cron, spec_json, next_at,
                                          now, now)).fetchone() is not None:
        return "created"
    old_id, old_cron, old_spec, old_next = conn.execute(SQL_SCHEDULE_BY_NAME,
                                                        (name,)).fetchone()
    outcome, next_at = add_outcome(name, (old_cron, old_spec, old_next), cron, spec_json,
                                   next_at, replace)
    if outcome == "replaced":
        conn.execute(SQL_REPLACE_SCHEDULE, (cron, spec_json, next_at, now, old_id))
    return outcome


def remove_schedule(conn: sqlite3.Connection, name: str) -> bool:
    """Delete a schedule by name or id; False if there was none."""
    return conn.execute(SQL_DELETE_SCHEDULE, (name, name)).rowcount > 0


def fire_due(conn: sqlite3.Connection, now: float,
             slots: Callable[[str, float, float], tuple[float, float, int]],
             plan: Callable[[str, str, float], NewWorkflow], limit: int = 100
             ) -> list[tuple[str, float, str | None, int, str | None]]:
    """Start one workflow for each schedule whose next slot has come, and advance it.

    `slots(cron, next_at, now)` gives (the slot to run, the next slot after now, how many
    older slots it passes over); `plan(spec_json, schedule_id, slot)` builds the workflow,
    whose idempotency key `schedule:<id>:<slot>` makes a second start of one slot
    impossible even if the advance were lost. Insert and advance share the transaction.
    A template that no longer validates (raises CoordError) does not start and does not
    hold the others up: its slot passes, with the error in the return value.
    Returns (schedule name, slot, workflow_id if newly started, slots passed over,
    error) per due schedule.
    """
    out: list[tuple[str, float, str | None, int, str | None]] = []
    for schedule_id, name, cron, spec_json, next_at in conn.execute(
            SQL_DUE_SCHEDULES, (now, limit)).fetchall():
        slot, following, passed = slots(cron, next_at, now)
        wid: str | None = None
        error = None
        try:
            wid, created, _ = insert_workflow(conn, now, plan(spec_json, schedule_id, slot))
            wid = wid if created else None
        except errors.CoordError as exc:
            error = str(exc)
        conn.execute(SQL_ADVANCE_SCHEDULE, (following, slot, now, schedule_id, next_at))
        out.append((name, slot, wid, passed, error))
    return out


def schedule_rows(conn: sqlite3.Connection) -> list[tuple]:
    return conn.execute(SQL_LIST_SCHEDULES).fetchall()
