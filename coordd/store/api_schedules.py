"""The store interface's schedules (coordd.store.api's `Store`, this area apart): recurring
workflows by cron, and the start of each slot that has come.

Callers: coordd.service.workflows.Workflows.schedule_add (`schedule_add`, then
`schedule_list` for its reply), schedule_list, schedule_remove, and Workflows.tick
(`schedule_fire_due`, with coordd.service.workflows.due_slots and Workflows._plan_slot). The
checks (name, cron, the graph) and the slot arithmetic stay there; the store applies
`add_outcome` (one rule, both stores) and starts a due slot's workflow in the same
transaction that advances the schedule. A slot starts once across every coordd of a
deployment: the due row is locked (PostgreSQL: FOR UPDATE SKIP LOCKED; SQLite: one
writer), advanced only from the `next_at` read, and its workflow's idempotency key
`schedule:<id>:<slot>` refuses a second start even were the advance lost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from coordd import errors
from coordd.wire.workflows import ScheduleView
from coordd.jsontext import lenient_json

if TYPE_CHECKING:
    from coordd.store.api_workflows import NewWorkflow

Slots = Callable[[str, float, float], tuple[float, float, int]]
"""(cron, stored next_at, now) -> (slot to run, next slot after now, slots passed over)."""
Plan = Callable[[str, str, float], "NewWorkflow"]
"""(spec_json, schedule_id, slot) -> the slot's workflow; raises errors.CoordError."""
Fired = tuple[str, float, str | None, int, str | None]
"""(schedule name, slot, workflow_id if newly started, slots passed over, error)."""


def add_outcome(name: str, old: tuple[str, str, float], cron: str, spec_json: str,
                next_at: float, replace: bool) -> tuple[str, float]:
    """What adding (`cron`, `spec_json`, first slot `next_at`) under a taken `name` does,
    given the stored (cron, spec_json, next_at): ("unchanged" | "replaced", the next slot
    to keep). A replace keeps the stored next slot unless the cron changed.

    Raises: errors.InvalidState (another cron or workflow, no `replace`).
    """
    old_cron, old_spec, old_next = old
    if (old_cron, old_spec) == (cron, spec_json):
        return "unchanged", old_next
    if not replace:
        what = "cron" if old_cron != cron else "workflow"
        raise errors.InvalidState(
            f"schedule {name} exists with a different {what} (cron {old_cron!r}); "
            f"remove it first or add with replace (coordctl schedule add --replace)")
    return "replaced", old_next if old_cron == cron else next_at


def schedule_view(row: Any) -> ScheduleView:
    """A ScheduleView of a row (schedule_id, name, cron, spec_json, next_at, last_slot,
    fired, created_at), as both stores' schedule list reads it."""
    sid, name, cron, spec_json, next_at, last_slot, fired, _created = row
    spec = lenient_json(spec_json, {})
    return ScheduleView(schedule_id=sid, name=name, cron=cron,
                        workflow=spec.get("name", "?") if isinstance(spec, dict) else "?",
                        next_at=next_at, last_slot=last_slot, fired=fired)


class ScheduleStore(Protocol):
    """Schedules over one database (see the module docstring). `now` as in
    coordd.store.api."""

    async def schedule_add(self, schedule_id: str, name: str, cron: str, spec_json: str,
                           next_at: float, replace: bool = False, *,
                           now: float | None = None) -> str:
        """Store a schedule (first slot `next_at`, Unix seconds); "created", or for a
        taken name `add_outcome`'s "unchanged" / "replaced" (the stored id, count and last
        slot stay). Raises: errors.InvalidState (see add_outcome)."""
        ...

    async def schedule_list(self) -> list[ScheduleView]:
        """Every schedule, by name."""
        ...

    async def schedule_remove(self, name: str, *, now: float | None = None) -> bool:
        """Delete the schedule of this name or id (its workflows stay); False: none."""
        ...

    async def schedule_fire_due(self, slots: Slots, plan: Plan, *, limit: int = 100,
                                now: float | None = None) -> list[Fired]:
        """Start one workflow for each schedule (up to `limit`, oldest slot first) whose
        next slot is at or before `now`, and advance it to the next slot after `now`, in
        one transaction. A plan that raises errors.CoordError starts nothing and its slot
        passes, the error in the result; the others go on."""
        ...


__all__ = ["Fired", "Plan", "ScheduleStore", "Slots", "add_outcome", "schedule_view"]
