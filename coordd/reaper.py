"""The reaper: return jobs whose lease expired to waiting (or the dead letter state), and
prune terminal jobs past retention now and then."""

from __future__ import annotations

import asyncio
import logging

from coordd import errors
from coordd.clock import Clock
from coordd.protocol import PruneResult, ReapResult
from coordd.service import Coordinator

logger = logging.getLogger(__name__)


class Reaper:
    """Run the workflow round (`Workflows.tick`) and `Coordinator.reap` every `interval`
    seconds, and `Coordinator.prune` every `prune_interval` seconds (defaults: the
    config's `reaper_interval_s` and `prune_interval_s`), until stopped.

    Expiry is judged by coordd's clock inside the writer's transaction, never by the
    caller's; a wall-clock jump (suspend) is handled by the writer before any reap. The
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
        """Prune when `prune_interval` has passed (monotonic) since the last prune."""
        now = self._clock.mono()
        if now < self._next_prune:
            return None
        self._next_prune = now + self._prune_interval
        return await self._coord.prune()

    async def run(self, stop: asyncio.Event) -> None:
        """Loop until `stop` is set; a failed round is logged and retried next interval."""
        while not await self._clock.wait(stop, self._interval):
            try:
                await self._coord.flows.tick()  # workflows: worker_absent, settle, schedules
                await self.run_once()
                await self.prune_if_due()
            except errors.Overloaded:
                logger.warning("reaper skipped a round: writer overloaded")
            except errors.CoordError as exc:
                logger.error("reaper round failed: %s", exc, extra={"action": "reap_failed"})
