"""Schedules on PostgreSQL (coordd.store.api_schedules.ScheduleStore): their statements
and the mixin PostgresStore inherits.

The tick takes the due rows FOR UPDATE SKIP LOCKED, so an active and a standby (or a
take-over mid-tick) never start one slot twice: a second tick skips the locked rows, and
after the first commits finds them advanced. The slot's workflow goes in through
coordd.store.postgres.workflows.insert_workflow (a savepoint) in the same transaction.
"""

from __future__ import annotations

from typing import Any

from coordd import errors
from coordd.wire.workflows import ScheduleView
from coordd.store.api_schedules import Fired, Plan, Slots, add_outcome, schedule_view
from coordd.store.postgres import workflows
from coordd.store.postgres.sql import NOW

SQL_INSERT_SCHEDULE = (  # $2 id, $3 name, $4 cron, $5 spec_json, $6 next_at
    "INSERT INTO schedules (schedule_id, name, cron, spec_json, next_at, created_at, "
    f"updated_at) VALUES ($2, $3, $4, $5, $6, {NOW}, {NOW}) ON CONFLICT (name) DO NOTHING "
    "RETURNING schedule_id"
)
SQL_SCHEDULE_BY_NAME = (
    "SELECT schedule_id, cron, spec_json, next_at FROM schedules WHERE name = $1 FOR UPDATE"
)
SQL_REPLACE_SCHEDULE = (  # $2 cron, $3 spec_json, $4 next_at, $5 id
    f"UPDATE schedules SET cron = $2, spec_json = $3, next_at = $4, updated_at = {NOW} "
    "WHERE schedule_id = $5"
)
SQL_LIST_SCHEDULES = (
    "SELECT schedule_id, name, cron, spec_json, next_at, last_slot, fired, created_at "
    "FROM schedules ORDER BY name"
)
SQL_DELETE_SCHEDULE = "DELETE FROM schedules WHERE name = $1 OR schedule_id = $1"
SQL_DUE_SCHEDULES = (  # $2 limit; the statement's NOW last
    f"SELECT schedule_id, name, cron, spec_json, next_at, {NOW} FROM schedules "
    f"WHERE next_at <= {NOW} ORDER BY next_at LIMIT $2 FOR UPDATE SKIP LOCKED"
)
SQL_ADVANCE_SCHEDULE = (  # $2 next_at, $3 slot, $4 id, $5 the next_at read
    "UPDATE schedules SET next_at = $2, last_slot = $3, fired = fired + 1, "
    f"updated_at = {NOW} WHERE schedule_id = $4 AND next_at = $5"
)


class SchedulesPostgres:
    """ScheduleStore over PostgresStore's pool (`self._conn()`); see the module docstring."""

    _conn: Any

    async def schedule_add(self, schedule_id: str, name: str, cron: str, spec_json: str,
                           next_at: float, replace: bool = False, *,
                           now: float | None = None) -> str:
        """Insert, or apply add_outcome to the row of the name (locked) in one transaction.
        Raises: errors.InvalidState."""
        async with self._conn() as conn, conn.transaction():
            if await conn.fetchval(SQL_INSERT_SCHEDULE, now, schedule_id, name, cron,
                                   spec_json, next_at) is not None:
                return "created"
            old_id, old_cron, old_spec, old_next = await conn.fetchrow(SQL_SCHEDULE_BY_NAME,
                                                                       name)
            outcome, next_at = add_outcome(name, (old_cron, old_spec, old_next), cron,
                                           spec_json, next_at, replace)
            if outcome == "replaced":
                await conn.execute(SQL_REPLACE_SCHEDULE, now, cron, spec_json, next_at,
                                   old_id)
            return outcome

    async def schedule_list(self) -> list[ScheduleView]:
        async with self._conn() as conn:
            return [schedule_view(r) for r in await conn.fetch(SQL_LIST_SCHEDULES)]

    async def schedule_remove(self, name: str, *, now: float | None = None) -> bool:
        async with self._conn() as conn:
            return await conn.execute(SQL_DELETE_SCHEDULE, name) != "DELETE 0"

    async def schedule_fire_due(self, slots: Slots, plan: Plan, *, limit: int = 100,
                                now: float | None = None) -> list[Fired]:
        """The due rows locked, each slot's workflow inserted and the row advanced, in one
        transaction (see the module docstring)."""
        out: list[Fired] = []
        async with self._conn() as conn, conn.transaction():
            for sid, name, cron, spec_json, next_at, t in await conn.fetch(
                    SQL_DUE_SCHEDULES, now, limit):
                slot, following, passed = slots(cron, next_at, t)
                wid: str | None = None
                error = None
                try:
                    res = await workflows.insert_workflow(conn, now, plan(spec_json, sid, slot))
                    wid = res.workflow_id if res.created else None
                except errors.CoordError as exc:
                    error = str(exc)
                await conn.execute(SQL_ADVANCE_SCHEDULE, now, following, slot, sid, next_at)
                out.append((name, slot, wid, passed, error))
        return out
