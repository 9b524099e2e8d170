"""Wall-clock steps seen by the writer: coordd's clock is re-anchored in the batch that
moves the stored duration times by the step (coordd.store.clock_steps).

Only the writer takes a step, and the clock takes it after that batch's COMMIT (a step
seen in a rolled-back batch is seen again). A jump ahead past `jump_s` (a suspend) also
gives live leases a whole lease from the resume, so frozen holders are not expired en
masse.
"""

from __future__ import annotations

import logging
import sqlite3

from coordd.clock import AnchoredClock
from coordd.store.clock_steps import shift_times

logger = logging.getLogger(__name__)


class ClockSteps:
    """Tell a wall-clock step past `step_s` (either way) and move the stored times by it.

    Args:
        clock: coordd's anchored clock (it takes the step: `AnchoredClock.shift`).
        step_s: a step larger than this re-anchors.
        jump_s: a jump ahead larger than this (a suspend) also gives live leases a whole
            lease from the resume (0 = off).
    """

    def __init__(self, clock: AnchoredClock, step_s: float, jump_s: float) -> None:
        self._clock = clock
        self._step_s = step_s
        self._jump_s = jump_s
        self.last_seen: float | None = None  # coordd's time at the last COMMIT

    def check(self, conn: sqlite3.Connection, now: float) -> float:
        """Move the stored times by a wall-clock step past `step_s`; return the step the
        clock takes after the COMMIT (0.0: none)."""
        step = self._clock.step()
        if not abs(step) > self._step_s:
            return 0.0
        grace = 0 < self._jump_s < step
        seen_at = now if self.last_seen is None else self.last_seen
        moved = shift_times(conn, now, step, seen_at, grace)
        logger.warning("wall clock stepped %+.1fs from coordd's clock (%s); moved the stored "
                       "times by it: %s", step, "suspend?" if grace else "NTP or a manual "
                       "change?", ", ".join(f"{n} {k}" for k, n in moved.items() if n) or "none",
                       extra={"action": "clock_step", "step_s": step, **moved})
        return step
