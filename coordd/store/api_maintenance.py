"""The store interface's maintenance (coordd.store.api's `Store`, this area apart): prune
by retention, the integrity check, backup, and the size figures `status` and `metrics`
report.

Callers: coordd.service.maintenance.Maintenance.prune (`prune_jobs` and
`prune_workflows` in batches, its pauses between them; `vacuum_step`, `checkpoint_wal`,
`optimize`; then the artifacts' `artifact_sweep` / `artifact_bytes`,
coordd.store.api_artifacts; `storage_bytes` for its `db_bytes`); Maintenance.check
(`integrity_check`); Coordinator.backup (`backup`); PostgreSQL's own `status`
(`storage_bytes`, `prunable`: SQLite reads both in its status read); the maintenance
round's `maintenance_window` (coordd.service.reaper). Retention, the grace
of artifacts, the batch loop and the pauses stay in coordd.service.maintenance.

What each store does: SQLite deletes in the single writer's short transactions, hands free pages
back (`incremental_vacuum`), checkpoints the WAL, refreshes the planner's statistics, checks
with `quick_check` and `foreign_key_check`, and copies itself (coordd.store.sqlite.backup).
PostgreSQL deletes in short transactions too; autovacuum reclaims space and refreshes statistics
(`vacuum_step` finds nothing, `checkpoint_wal` and `optimize` do nothing); `check` reports the
pages the server found corrupt (pg_stat_database's checksum_failures) and rows no constraint
guards; `backup` is refused, naming pg_dump.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

import msgspec

from coordd.wire.protocol import BackupResult
from coordd.store.upkeep import PRUNE_BATCH
from coordd.store.workflows import PRUNE_BATCH as WORKFLOW_PRUNE_BATCH
from coordd.store.views import PRUNABLE_COUNTED_MAX

# Invariants both stores check, as (what is wrong, SQL counting the rows that break it):
# the same text on SQLite and PostgreSQL.
INVARIANTS = (
    ("lease(s) on a job that is not running",
     "SELECT count(*) FROM leases l JOIN jobs j ON j.job_id = l.job_id "
     "WHERE j.status <> 'running'"),
    ("running job(s) without a lease",
     "SELECT count(*) FROM jobs j WHERE j.status = 'running' "
     "AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.job_id = j.job_id)"),
)


class Integrity(msgspec.Struct, kw_only=True):
    """`integrity_check`'s answer. `quick_check`: "ok" or what the database found wrong
    in its pages (SQLite: PRAGMA quick_check; PostgreSQL: checksum failures);
    `foreign_key_violations`: rows pointing at a row that is gone (SQLite:
    foreign_key_check; PostgreSQL, whose server enforces its foreign keys: fleet-limit
    holds of a job without a lease); `invariants`: "N <what>" per rule of INVARIANTS
    (and the store's own) that rows break, empty when none."""

    quick_check: str
    foreign_key_violations: int
    invariants: list[str] = []


class MaintenanceStore(Protocol):
    """Maintenance over one database (see the module docstring). `now` as in
    coordd.store.api."""

    async def prune_jobs(self, cutoff: float, limit: int = PRUNE_BATCH, *,
                         now: float | None = None) -> tuple[int, int]:
        """Delete up to `limit` terminal jobs finished before `cutoff` (Unix seconds), a
        workflow's only once its workflow ended before `cutoff` too, oldest first, with
        their events (the newest event of all stays: a `watch_events` cursor), logs and
        leases' rows, and the artifact records no job refers to any more; return (jobs,
        artifact records) deleted. SQLite keeps the artifact files for the sweep;
        PostgreSQL deletes a record's bytes with it, unless a checkpoint names it or it
        was put again since `cutoff`."""
        ...

    async def prune_workflows(self, cutoff: float, limit: int = WORKFLOW_PRUNE_BATCH, *,
                              now: float | None = None) -> int:
        """Delete up to `limit` ended workflows finished before `cutoff` whose last job
        has gone; return how many."""
        ...

    async def prunable(self, cutoff: float, most: int = PRUNABLE_COUNTED_MAX) -> int:
        """How many jobs `prune_jobs` would delete at `cutoff`, counted up to `most`."""
        ...

    async def vacuum_step(self, *, now: float | None = None) -> int:
        """Hand one bounded step of free pages back to the file system; how many stay
        free (SQLite; PostgreSQL: 0, autovacuum does it)."""
        ...

    async def checkpoint_wal(self) -> None:
        """Copy the WAL into the database file (SQLite, after a prune; PostgreSQL: no-op)."""
        ...

    async def optimize(self, *, now: float | None = None) -> None:
        """Refresh the planner's statistics where stale (SQLite: PRAGMA optimize;
        PostgreSQL: no-op, autoanalyze)."""
        ...

    async def integrity_check(self) -> Integrity:
        """Check the live database (a heavy read; see Integrity)."""
        ...

    async def storage_bytes(self) -> tuple[int, int]:
        """(database bytes, WAL bytes): SQLite's file and its -wal (0 when absent);
        PostgreSQL: pg_database_size of the database, 0 (its WAL is the cluster's)."""
        ...

    async def backup(self, dest: str, *, now: float | None = None) -> BackupResult:
        """A verified, consistent copy at `dest` (SQLite: coordd.store.sqlite.backup.backup, the
        artifact files beside it). Raises: errors.BadRequest, Unavailable, CoordError
        (see coordd.store.sqlite.backup); PostgreSQL: errors.InvalidState, naming pg_dump."""
        ...

    def maintenance_window(self) -> AbstractContextManager[None]:
        """Within this block (and the tasks it starts) the store serves the calls as
        coordd's own maintenance round (coordd.service.reaper), which must not be refused
        with the producers' work. SQLite: their writes go in the single writer's urgent
        lane (coordd.store.sqlite.lanes), bounded apart from new work. PostgreSQL: nothing
        to do, the pool has no lanes (a round's statement waits for a connection like any
        call, and a step refused `overloaded` is tried again next round)."""
        ...


def invariant_problems(counts: list[int], rules: tuple[tuple[str, str], ...] = INVARIANTS
                       ) -> list[str]:
    """"N <what>" for each rule whose count is not 0."""
    return [f"{n} {what}" for (what, _), n in zip(rules, counts) if n]


__all__ = ["INVARIANTS", "Integrity", "MaintenanceStore", "invariant_problems"]
