"""Schedules on SQLite (coordd.store.api_schedules.ScheduleStore): coordd.store.schedules'
functions as ops of the single writer, the list on the read pool."""

from __future__ import annotations

from typing import Any

from coordd.wire.workflows import ScheduleView
from coordd.store import schedules
from coordd.store.api_schedules import Fired, Plan, Slots, schedule_view


class SQLiteSchedules:
    """ScheduleStore over the writer and read pool (a mixin: SQLiteStore has `_write` and
    `readers`)."""

    _write: Any
    readers: Any

    async def schedule_add(self, schedule_id: str, name: str, cron: str, spec_json: str,
                           next_at: float, replace: bool = False, *,
                           now: float | None = None) -> str:
        return await self._write(lambda conn, t: schedules.add_schedule(
            conn, t, schedule_id, name, cron, spec_json, next_at, replace), now)

    async def schedule_list(self) -> list[ScheduleView]:
        return [schedule_view(r) for r in await self.readers.run(schedules.schedule_rows)]

    async def schedule_remove(self, name: str, *, now: float | None = None) -> bool:
        return await self._write(lambda conn, _t: schedules.remove_schedule(conn, name), now)

    async def schedule_fire_due(self, slots: Slots, plan: Plan, *, limit: int = 100,
                                now: float | None = None) -> list[Fired]:
        """coordd.store.schedules.fire_due in one writer op."""
        return await self._write(lambda conn, t: schedules.fire_due(conn, t, slots, plan, limit),
                                 now)
