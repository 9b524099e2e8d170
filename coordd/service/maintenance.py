"""Maintenance of the store: `prune` (terminal jobs past retention, hub messages, free
pages, unreferenced artifacts) and `check`, run by the reaper and on request, over the
store's maintenance and artifact operations (coordd.store.api_maintenance,
api_artifacts), in short steps that leave the store to the hot path."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from coordd.wire.protocol import Empty, PruneResult
from coordd.store.api_maintenance import PRUNE_BATCH, WORKFLOW_PRUNE_BATCH

if TYPE_CHECKING:
    from coordd.service import Coordinator

logger = logging.getLogger(__name__)

ARTIFACT_GRACE_S = 3600.0  # an unreferenced artifact younger than this is kept
MAINTENANCE_PAUSE_MAX_S = 0.1  # the longest pause after one maintenance step


class Maintenance:
    """The store's upkeep for one Coordinator (its store, hub and clock)."""

    def __init__(self, coord: Coordinator) -> None:
        self._coord = coord
        self._pause = asyncio.Event()  # never set: pauses run to their end

    async def prune(self, p: Empty | None = None, now: float | None = None) -> PruneResult:
        """Delete terminal jobs finished more than `retention_s` before `now` (default:
        coordd's clock at each batch) with their events and unreferenced artifact records,
        in batches of PRUNE_BATCH (one transaction each), then hand the free pages back to
        the file system (SQLite's `incremental_vacuum`, bounded per transaction; PostgreSQL:
        autovacuum) and checkpoint the WAL so the file shrinks. Expired hub messages, and
        processed ones and broadcasts past `message_retention_s`, go too (Hub.purge), and
        agents not heard from for `message_retention_s` are forgotten (Hub.purge_agents).
        Then delete the stored artifacts nothing refers to any more that are older than
        ARTIFACT_GRACE_S (`artifact_sweep`): a file a worker has stored but not yet
        recorded is fresh, and kept. An ended workflow's row goes once its last job has.
        """
        c, st = self._coord, self._coord.store
        retention = c.config.retention_s

        def cutoff() -> float:
            return (c.clock.wall() if now is None else now) - retention
        pruned = artifacts = 0
        while True:
            n, a = await self.step(lambda: st.prune_jobs(cutoff(), PRUNE_BATCH))
            pruned, artifacts = pruned + n, artifacts + a
            if n < PRUNE_BATCH:
                break
        while await self.step(lambda: st.prune_workflows(cutoff())) == WORKFLOW_PRUNE_BATCH:
            pass  # ended workflows whose last job just went
        messages = await c.hub.purge(now)
        agents = await c.hub.purge_agents(now)
        free = await self.step(st.vacuum_step)
        while free:
            left = await self.step(st.vacuum_step)
            if left >= free:
                break  # nothing more comes free
            free = left
        if pruned or messages or agents:
            await st.checkpoint_wal()
            logger.info("pruned %d terminal job(s) past retention, %d message(s) and %d "
                        "agent(s)", pruned, messages, agents, extra={
                            "action": "prune", "n": pruned, "messages": messages,
                            "agents": agents})
        await st.optimize()
        before = (c.clock.wall() if now is None else now) - ARTIFACT_GRACE_S
        files = await st.artifact_sweep(before)
        c.artifact_bytes = await st.artifact_bytes()
        db_bytes, _wal = await st.storage_bytes()
        return PruneResult(pruned=pruned, artifacts=artifacts, free_pages=free,
                           db_bytes=db_bytes, artifact_files=files,
                           messages=messages, agents=agents)

    async def check(self, p: Empty | None = None) -> dict[str, Any]:
        """The live database's integrity (the store's `integrity_check`): `quick_check`
        ("ok" or what is wrong), `foreign_key_violations` (a count) and `invariants`
        (the rules rows break, empty when none)."""
        got = await self._coord.store.integrity_check()
        return {"quick_check": got.quick_check,
                "foreign_key_violations": got.foreign_key_violations,
                "invariants": got.invariants}

    async def step(self, op: Any) -> Any:
        """Run one short maintenance transaction (`op()`), then pause as long as it took
        (coordd's monotonic clock): a long prune takes at most about half of the store's
        time, and most claims meet no maintenance step in their batch."""
        c = self._coord
        started = c.clock.mono()
        result = await op()
        took = c.clock.mono() - started
        if took > 0:
            await c.clock.wait(self._pause, min(took, MAINTENANCE_PAUSE_MAX_S))
        return result
