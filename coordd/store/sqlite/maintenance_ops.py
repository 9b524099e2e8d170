"""Maintenance on SQLite (coordd.store.api_maintenance.MaintenanceStore): coordd.store's
prune, vacuum and optimize functions as ops of the single writer, the checks and counts
on the read pool, the backup of coordd.store.sqlite.backup in a thread."""

from __future__ import annotations

import asyncio
import os
from contextlib import AbstractContextManager
from typing import Any

from coordd.store.sqlite import backup as backups
from coordd.store.sqlite import lanes
from coordd.store import upkeep
from coordd.store import views
from coordd.wire.protocol import BackupResult
from coordd.store import workflows as wstore
from coordd.store.api_maintenance import (
    INVARIANTS, PRUNABLE_COUNTED_MAX, PRUNE_BATCH, WORKFLOW_PRUNE_BATCH, Integrity,
    invariant_problems,
)


def file_size(path: str) -> int:
    """The size of `path` in bytes; 0 when it is absent or unreadable."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _integrity(conn: Any) -> Integrity:
    qc, fk = views.integrity(conn)
    counts = [conn.execute(sql).fetchone()[0] for _, sql in INVARIANTS]
    return Integrity(quick_check=qc, foreign_key_violations=len(fk),
                     invariants=invariant_problems(counts))


class SQLiteMaintenance:
    """MaintenanceStore over the writer and read pool (a mixin: SQLiteStore has `path`,
    `writer`, `readers`, `_write`; the artifact folder from SQLiteArtifactOps)."""

    path: str
    writer: Any
    readers: Any
    _write: Any
    artifact_dir: str

    async def prune_jobs(self, cutoff: float, limit: int = PRUNE_BATCH, *,
                         now: float | None = None) -> tuple[int, int]:
        """coordd.store.upkeep.prune_batch, one writer op."""
        return await self._write(lambda conn, _t: upkeep.prune_batch(conn, cutoff, limit), now)

    async def prune_workflows(self, cutoff: float, limit: int = WORKFLOW_PRUNE_BATCH, *,
                              now: float | None = None) -> int:
        return await self._write(
            lambda conn, _t: wstore.prune_workflows(conn, cutoff, limit), now)

    async def prunable(self, cutoff: float, most: int = PRUNABLE_COUNTED_MAX) -> int:
        return await self.readers.run(views.prunable, cutoff, most)

    async def vacuum_step(self, *, now: float | None = None) -> int:
        return await self._write(lambda conn, _t: upkeep.vacuum_step(conn), now)

    async def checkpoint_wal(self) -> None:
        await self.writer.checkpoint()

    async def optimize(self, *, now: float | None = None) -> None:
        await self._write(lambda conn, _t: upkeep.optimize(conn), now)

    async def integrity_check(self) -> Integrity:
        """quick_check, foreign_key_check and INVARIANTS on one read connection."""
        return await self.readers.run(_integrity, heavy=True)

    async def storage_bytes(self) -> tuple[int, int]:
        return file_size(self.path), file_size(self.path + "-wal")

    async def backup(self, dest: str, *, now: float | None = None) -> BackupResult:
        """coordd.store.sqlite.backup.backup in a thread, beside the writer."""
        return await asyncio.to_thread(backups.backup, self.path, self.artifact_dir, dest)

    def maintenance_window(self) -> AbstractContextManager[None]:
        """The writer's urgent lane for this task's writes (coordd.store.sqlite.lanes)."""
        return lanes.maintenance()
