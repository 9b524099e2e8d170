"""The reaper: return jobs whose lease expired to waiting (or the dead letter state)."""

from __future__ import annotations

import asyncio
import logging

from coordd import errors
from coordd.clock import Clock
from coordd.protocol import ReapResult
from coordd.service import Coordinator

logger = logging.getLogger(__name__)

REAPER_INTERVAL_DEFAULT = 5.0


class Reaper:
    """Run `Coordinator.reap` every `interval` seconds until stopped.

    Expiry is judged by coordd's clock inside the writer's transaction, never by the
    caller's; a wall-clock jump (suspend) is handled by the writer before any reap.
    """

    def __init__(self, coord: Coordinator, clock: Clock,
                 interval: float = REAPER_INTERVAL_DEFAULT) -> None:
        if interval <= 0:
            raise ValueError("reaper interval must be > 0")
        self._coord = coord
        self._clock = clock
        self._interval = interval

    async def run_once(self) -> ReapResult:
        """Reap once; return how many leases were reaped."""
        return await self._coord.reap()

    async def run(self, stop: asyncio.Event) -> None:
        """Loop until `stop` is set; a failed round is logged and retried next interval."""
        while not await self._clock.wait(stop, self._interval):
            try:
                await self.run_once()
            except errors.Overloaded:
                logger.warning("reaper skipped a round: writer overloaded")
            except errors.CoordError as exc:
                logger.error("reaper round failed: %s", exc, extra={"action": "reap_failed"})
