"""What a worker last said about itself beyond readings, and what follows from it for a
job's kind and for the `workers` view (pure, every store)."""

from __future__ import annotations

from typing import Any

import msgspec


class WorkerState(msgspec.Struct, frozen=True):
    """What a worker last said about itself beyond readings (None: an older worker that
    does not send it)."""

    incarnation: str | None = None
    kinds: list[str] | None = None
    broken_kinds: dict[str, str] = {}
    offline_at: float | None = None


def runs_kind(state: WorkerState | None, kind: str) -> bool:
    """Whether a worker takes jobs of `kind` (one that sends no kinds takes any)."""
    return state is None or state.kinds is None or kind in state.kinds


def kind_absent_reason(kind: str, live: list[str], states: dict[str, WorkerState]) -> str:
    """Why no worker of `live` (ids with the job's role) takes `kind`, naming the workers
    where it is broken and why."""
    broken = [f"{w}: {states[w].broken_kinds[kind]}" for w in live
              if w in states and kind in states[w].broken_kinds]
    return f"no live worker runs kind {kind}" + (f" (broken on {'; '.join(broken)})"
                                                  if broken else "")


def reading_notes(readings: dict[str, Any]) -> list[str]:
    """The notes `workers` prints for each gate reading a worker could not give (its reason)."""
    notes = []
    if readings.get("memory_used_pct") is None and readings.get("memory_reason"):
        notes.append(f"memory: unavailable ({readings['memory_reason']})")
    if readings.get("temperature_c") is None:
        notes.append(f"temperature: unavailable ({readings.get('temperature_reason') or 'no reading'})")
    if readings.get("on_battery") is None:
        notes.append(f"power: unknown ({readings.get('power_reason') or 'no reading'})")
    if readings.get("user_idle_s") is None:
        notes.append(f"user idle: unknown ({readings.get('user_idle_reason') or 'no reading'})")
    return notes
