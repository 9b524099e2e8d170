"""Maintenance of the store: `prune` (terminal jobs past retention, hub messages, free
pages, unreferenced artifact files), run by the reaper and on request, in short steps that
leave the writer to the hot path."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from coordd import cas, store, views
from coordd.metrics import tree_bytes
from coordd.protocol import Empty, PruneResult
from coordd.store import workflows as wstore
from coordd.store.sqlite_maintenance import file_size

if TYPE_CHECKING:
    from coordd.service import Coordinator

logger = logging.getLogger(__name__)

ARTIFACT_GRACE_S = 3600.0  # an unreferenced artifact file younger than this is kept
MAINTENANCE_PAUSE_MAX_S = 0.1  # the longest pause after one maintenance step


class Maintenance:
    """The store's upkeep for one Coordinator (its writer, readers, hub and clock)."""

    def __init__(self, coord: Coordinator) -> None:
        self._coord = coord
        self._pause = asyncio.Event()  # never set: pauses run to their end

    async def prune(self, p: Empty | None = None, now: float | None = None) -> PruneResult:
        """Delete terminal jobs finished more than `retention_s` before `now` (default:
        coordd's clock at each batch) with their events and unreferenced artifact rows,
        in batches of `store.PRUNE_BATCH` (one transaction each), then hand the free
        pages back to the file system (`incremental_vacuum`, bounded per transaction)
        and checkpoint the WAL so the file shrinks. Expired hub messages, and processed
        ones and broadcasts past `message_retention_s`, go first too (Hub.purge), and agents
        not heard from for `message_retention_s` are forgotten (Hub.purge_agents). Then
        delete the artifact files nothing refers to any more and that are older than
        ARTIFACT_GRACE_S (coordd.cas.sweep): a file a worker has stored but not yet
        recorded is fresh, and kept. An ended workflow's row goes once its last job has.
        """
        c = self._coord
        retention = c.config.retention_s
        pruned = artifacts = 0
        while True:
            n, a = await self.step(lambda conn, wall: store.prune_batch(
                conn, (wall if now is None else now) - retention, store.PRUNE_BATCH))
            pruned, artifacts = pruned + n, artifacts + a
            if n < store.PRUNE_BATCH:
                break
        while await self.step(lambda conn, wall: wstore.prune_workflows(
                conn, (wall if now is None else now) - retention)) == wstore.PRUNE_BATCH:
            pass  # ended workflows whose last job just went
        messages = await c.hub.purge(now)
        agents = await c.hub.purge_agents(now)
        free = await self.step(lambda conn, _now: store.vacuum_step(conn))
        while free:
            left = await self.step(lambda conn, _now: store.vacuum_step(conn))
            if left >= free:
                break  # nothing more comes free
            free = left
        if pruned or messages or agents:
            await c.writer.checkpoint()
            logger.info("pruned %d terminal job(s) past retention, %d message(s) and %d "
                        "agent(s)", pruned, messages, agents, extra={
                            "action": "prune", "n": pruned, "messages": messages,
                            "agents": agents})
        await c.writer.run(lambda conn, _now: store.optimize(conn))
        refs = await c.readers.run(views.artifact_refs, heavy=True)
        before = (c.clock.wall() if now is None else now) - ARTIFACT_GRACE_S
        files = await asyncio.to_thread(cas.sweep, c.artifact_dir, set(refs), before)
        c.artifact_bytes = await asyncio.to_thread(tree_bytes, c.artifact_dir)
        return PruneResult(pruned=pruned, artifacts=artifacts, free_pages=free,
                           db_bytes=file_size(c.db_path), artifact_files=files,
                           messages=messages, agents=agents)

    async def step(self, op: Any) -> Any:
        """Run one short maintenance transaction, then pause as long as it took (coordd's
        monotonic clock): a long prune takes at most about half of the writer's time,
        and most claims meet no maintenance step in their batch."""
        c = self._coord
        started = c.clock.mono()
        result = await c.writer.run(op)
        took = c.clock.mono() - started
        if took > 0:
            await c.clock.wait(self._pause, min(took, MAINTENANCE_PAUSE_MAX_S))
        return result
