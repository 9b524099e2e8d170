"""The run_at timer of the parked claims (coordd.service.push): one task waits for the
earliest scheduled job and, as each comes due, says its role and kind may be claimable.

The due times come from the store (`scheduled(now)`: the (run_at, role, kind) of every
waiting job not yet due) when it starts and after a wall-clock step, and from the job
rows each commit notes (`add`) meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from collections.abc import Callable

from coordd.clock import Clock

logger = logging.getLogger(__name__)

TIMER_IDLE_S = 3600.0  # the run_at timer's wait when no job is scheduled
DUE_SLACK_S = 0.001    # fire a run_at timer this much late, so the claim's `now` has passed it

Scheduled = Callable[[float], list[tuple[float, str, str]]]  # now -> (run_at, role, kind)


class RunAtTimer:
    """Calls `due(role, kind)` once per scheduled job as it comes due (by `clock.wall()`)."""

    def __init__(self, clock: Clock, due: Callable[[str, str], None]) -> None:
        self._clock = clock
        self._due = due
        self._heap: list[tuple[float, str, str]] = []  # (run_at, role, kind)
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._scheduled: Scheduled | None = None

    def start(self, scheduled: Scheduled) -> None:
        """Start the timer with `scheduled(now)`, the jobs already scheduled in the store
        (asked again after a clock step). Needs a running loop."""
        self._scheduled = scheduled
        self._heap = list(scheduled(self._clock.wall()))
        heapq.heapify(self._heap)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="coordd-push-timer")

    def add(self, run_at: float, role: str, kind: str) -> None:
        """A job of `role`/`kind` comes due at `run_at` (Unix seconds, ahead of now)."""
        heapq.heappush(self._heap, (run_at, role, kind))
        if self._heap[0][0] == run_at:
            self._kick.set()

    def clock_stepped(self, step_s: float) -> None:
        """The store moved its stored times by a wall-clock step: the due times are read
        afresh and the wait taken from the new clock. Never raises."""
        try:
            if self._scheduled is not None:
                self._heap = list(self._scheduled(self._clock.wall()))
                heapq.heapify(self._heap)
            self._kick.set()
        except Exception:  # waiters time out instead; the store's writer must not fail
            logger.exception("run_at timer after a clock step of %+.1fs", step_s,
                             extra={"action": "push_failed"})

    async def close(self) -> None:
        """Stop the timer. Idempotent."""
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        """Wake parked claims as scheduled jobs come due (one wait, for the earliest)."""
        while True:
            now = self._clock.wall()
            while self._heap and self._heap[0][0] <= now:
                _, role, kind = heapq.heappop(self._heap)
                self._due(role, kind)
            delay = self._heap[0][0] - now + DUE_SLACK_S if self._heap else TIMER_IDLE_S
            self._kick.clear()
            await self._clock.wait(self._kick, delay)


__all__ = ["DUE_SLACK_S", "TIMER_IDLE_S", "RunAtTimer", "Scheduled"]
