"""The reaper: return jobs whose lease expired to waiting (or the dead letter state), and
prune terminal jobs past retention now and then.

The rule not to break: a maintenance step that fails (a full disk, no file descriptor
left, a bug) is logged and tried again next round; it never ends coordd (issue 21).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from coordd import errors
from coordd.net import fdlimit
from coordd.clock import Clock
from coordd.wire.protocol import PruneResult, ReapResult
from coordd.service import Coordinator

logger = logging.getLogger(__name__)

PRUNE_RETRY_S = 60.0  # a failed prune is tried again this soon (at most prune_interval)


class Reaper:
    """Run the workflow round (`Workflows.tick`) and `Coordinator.reap` every `interval`
    seconds, and `Coordinator.prune` every `prune_interval` seconds (defaults: the
    config's `reaper_interval_s` and `prune_interval_s`), until stopped.

    Expiry is judged by the store's clock inside its transaction, never by the caller's;
    a wall-clock jump (suspend) is handled by the store before any reap. The
    waits run on the clock's monotonic time, so a wall-clock jump neither wakes the loop
    early nor makes it spin.
    """

    def __init__(self, coord: Coordinator, clock: Clock,
                 interval: float | None = None,
                 prune_interval: float | None = None) -> None:
        interval = coord.config.reaper_interval_s if interval is None else interval
        if interval <= 0:
            raise ValueError("reaper interval must be > 0")
        prune_interval = coord.config.prune_interval_s if prune_interval is None \
            else prune_interval
        if prune_interval <= 0:
            raise ValueError("prune interval must be > 0")
        self._coord = coord
        self._clock = clock
        self._interval = interval
        self._prune_interval = prune_interval
        self._next_prune = clock.mono()  # the first round prunes (after a long downtime)

    async def run_once(self) -> ReapResult:
        """Reap once; return how many leases were reaped."""
        return await self._coord.reap()

    async def prune_if_due(self) -> PruneResult | None:
        """Prune (`Coordinator.upkeep`) when `prune_interval` has passed (monotonic) since
        the last prune; its result."""
        now = self._clock.mono()
        if now < self._next_prune:
            return None
        self._next_prune = now + min(self._prune_interval, PRUNE_RETRY_S)  # if it fails
        result = await self._coord.upkeep()
        self._next_prune = now + self._prune_interval
        return result

    async def round(self) -> list[str]:
        """One round: workflows (absent workers, settling, schedules), reap, the quiet
        heartbeats' last-seen times when due (coordd.service.beats), prune when due.
        Each step's failure is logged and leaves the others to run; returns the names of
        the steps that failed. The store serves them as maintenance
        (`maintenance_window`: on SQLite the writer's urgent lane)."""
        failed = []
        with self._coord.store.maintenance_window():
            for name, step in (("workflows", self._coord.workflow_tick), ("reap", self.run_once),
                               ("liveness", self._coord.beats.flush_if_due),
                               ("prune", self.prune_if_due)):
                if not await _step(name, step):
                    failed.append(name)
        return failed

    async def run(self, stop: asyncio.Event) -> None:
        """Loop until `stop` is set; a failed step is logged and retried next round."""
        while not await self._clock.wait(stop, self._interval):
            await self.round()


async def _step(name: str, fn: Callable[[], Awaitable[Any]]) -> bool:
    """Run one maintenance step; log its failure (never raise it). True if it succeeded."""
    try:
        await fn()
        return True
    except errors.Overloaded as exc:
        logger.warning("maintenance step %s skipped: %s", name, exc,
                       extra={"action": "maintenance_skipped", "step": name})
    except errors.CoordError as exc:
        logger.error("maintenance step %s failed: %s: %s", name, exc.code, exc,
                     extra={"action": "maintenance_failed", "step": name})
    except OSError as exc:
        if not fdlimit.note_exhaustion(exc, f"maintenance step {name}"):
            logger.error("maintenance step %s failed: %s", name, exc,
                         extra={"action": "maintenance_failed", "step": name})
    except Exception:
        logger.exception("maintenance step %s failed", name,
                         extra={"action": "maintenance_failed", "step": name})
    return False
