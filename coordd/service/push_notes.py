"""What the store tells the parked calls (coordd.service.push): the rows a transaction
noted, kept until its COMMIT and then turned into wake-ups, or dropped at a rollback.

SQLite (coordd.store.sqlite.wakeups) notes inside the writer's transaction: `job_waiting`
and `job_ended` from its job hook, `note` from its TEMP triggers; then `committed()` or
`rolled_back()`. PostgreSQL sends `store_note` after the commit it concerns (its NOTIFY).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from coordd.clock import Clock
from coordd.service.parked import ClaimWaiter, Waiter
from coordd.service.run_at import RunAtTimer

logger = logging.getLogger(__name__)

Note = tuple[str, str, Any, Any, Any]  # (what, job_id, a, b, c), coordd.store.push


def _roles(text: Any) -> list[str]:
    try:
        roles = json.loads(text)
    except (TypeError, ValueError):
        return []
    return [r for r in roles if isinstance(r, str)] if isinstance(roles, list) else []


class NoteIntake:
    """Mixed into Push (its registries, timer and wake-up rules)."""

    _clock: Clock
    _notes: list[Note]
    _claims: dict[int, ClaimWaiter]
    _jobs: dict[str, set[Waiter]]
    _workers: dict[str, set[Waiter]]
    _events: set[Waiter]
    _timer: RunAtTimer
    _events_moved: Callable[[], bool] | None
    heartbeat: Callable[[str, frozenset[str]], None]
    job_ready: Callable[..., None]
    limits_changed: Callable[[], None]

    def note(self, what: str, job_id: str, a: Any, b: Any, c: Any) -> None:
        """Record one trigger row (coordd.store.push); called inside the transaction."""
        self._notes.append((what, job_id, a, b, c))

    def job_waiting(self, job_id: str, role: str, kind: str, run_at: float | None) -> None:
        """A job entered waiting (the store's job hook; `run_at` when still ahead): noted
        while claims are parked or looking, and always for the run_at timer."""
        if run_at is not None or self._claims:
            self._notes.append(("w", job_id, role, kind, run_at))

    def job_ended(self, job_id: str) -> None:
        """A job reached a terminal status (the store's job hook): noted if waited for."""
        if job_id in self._jobs:
            self._notes.append(("t", job_id, None, None, None))

    def rolled_back(self) -> None:
        """The batch's transaction failed: nothing it noted happened."""
        self._notes.clear()

    def committed(self) -> None:
        """The batch committed: wake what its notes concern, and every `watch_events` call
        when the store says job events committed since it was last asked. Never raises."""
        try:
            if self._events and self._events_moved is not None and self._events_moved():
                for w in self._events:
                    w.wake()
            if self._notes:
                notes, self._notes = self._notes, []
                self._dispatch(notes)
        except Exception:  # a bug here must not fail the writer; waiters time out instead
            self._notes.clear()
            logger.exception("wake-up dispatch failed", extra={"action": "push_failed"})

    def store_note(self, payload: str) -> None:
        """A wake-up a store sends after the commit it concerns (PostgreSQL's NOTIFY,
        coordd.store.postgres.push_sql): "t<job_id>" the job ended, "c<worker_id>" the
        worker's jobs have a new action, "e" new job events; "*" some may have been
        missed: every parked `wait_for` call looks again. Never raises."""
        what, key = payload[:1], payload[1:]
        if what == "t":
            group: Iterable[Waiter] = list(self._jobs.get(key, ()))
        elif what == "c":
            group = list(self._workers.get(key, ()))
        elif what == "e":
            group = list(self._events)
        elif what == "*":
            group = [w for g in (*self._jobs.values(), *self._workers.values(), self._events)
                     for w in list(g)]
        else:
            logger.debug("unknown store wake-up %r", payload)
            return
        for w in group:
            w.wake()

    def _dispatch(self, notes: list[Note]) -> None:
        now = self._clock.wall()
        ready: dict[tuple[str, str], int] = {}  # (role, kind) -> jobs now claimable
        limits_freed = False
        for what, job_id, a, b, c in notes:
            if what == "w":
                if isinstance(c, (int, float)) and c > now:
                    self._timer.add(float(c), a, b)
                else:
                    ready[(a, b)] = ready.get((a, b), 0) + 1
            elif what == "t":
                for w in self._jobs.get(job_id, ()):
                    w.wake()
            elif what == "c" and a is not None:
                for w in self._workers.get(a, ()):
                    w.wake()
            elif what == "h":  # a heartbeat (job_id is the worker id, a its roles JSON)
                self.heartbeat(job_id, frozenset(_roles(a)))
            elif what == "l":  # units of limit `a` freed
                limits_freed = True
        for (role, kind), n in ready.items():  # one pass per (role, kind), not per job
            self.job_ready(role, kind, n)
        if limits_freed:
            self.limits_changed()


__all__ = ["Note", "NoteIntake"]
