"""Maintenance on PostgreSQL (coordd.store.api_maintenance.MaintenanceStore): its
statements and the mixin PostgresStore inherits.

A prune batch is one transaction: the jobs picked (FOR UPDATE SKIP LOCKED: a job another
session holds waits for the next batch), their events but the newest of all (as on
SQLite, whose event ids are rowids), the jobs (leases, logs, edges, requests and limits
go by ON DELETE CASCADE), then the artifacts only they referred to, bytes and all, unless
a checkpoint record names one or it was put again since the cutoff. Space and statistics
are autovacuum's; `backup` is refused (pg_dump makes a consistent copy, artifacts
included, with the server's own tools).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Any

from coordd import errors
from coordd.wire.protocol import BackupResult
from coordd.store.api_maintenance import (
    INVARIANTS, PRUNABLE_COUNTED_MAX, PRUNE_BATCH, WORKFLOW_PRUNE_BATCH, Integrity,
    invariant_problems,
)
from coordd.store.postgres.artifacts import PATH_PREFIX, checkpoint_refs

BACKUP_REFUSED = (
    "backup copies a SQLite database; on PostgreSQL take a consistent copy with the "
    "server's tools: pg_dump --format=custom --file=FILE DBNAME (restore with pg_restore "
    "into an empty database), or pg_basebackup for the whole cluster; artifacts are in "
    "the database, so the dump holds them")

_PRUNE_WHERE = (  # $1 cutoff: coordd.store.SQL_PRUNE_WHERE on PostgreSQL
    "FROM jobs j WHERE j.finished_at IS NOT NULL AND j.finished_at < $1 "
    "AND j.status IN ('succeeded', 'failed', 'cancelled', 'skipped') "
    "AND (j.workflow_id IS NULL OR EXISTS (SELECT 1 FROM workflows w "
    "WHERE w.workflow_id = j.workflow_id AND w.status <> 'running' "
    "AND w.finished_at < $1))"
)
SQL_PRUNE_JOBS = (  # $1 cutoff, $2 limit: (jobs deleted, their artifacts' sha256s)
    "WITH pick AS (SELECT j.job_id " + _PRUNE_WHERE + " ORDER BY j.finished_at LIMIT $2 "
    "FOR UPDATE OF j SKIP LOCKED), "
    "ev AS (DELETE FROM job_events e USING pick WHERE e.job_id = pick.job_id "
    "AND e.event_id < (SELECT max(event_id) FROM job_events)), "
    "gone AS (DELETE FROM jobs j USING pick WHERE j.job_id = pick.job_id "
    "RETURNING j.artifact_sha256) "
    "SELECT (SELECT count(*) FROM gone), "
    "ARRAY(SELECT DISTINCT artifact_sha256 FROM gone WHERE artifact_sha256 IS NOT NULL)"
)
SQL_NAMED_BY_CHECKPOINTS = (  # $1 sha256s: the checkpoint records that may name one
    "SELECT checkpoint_json FROM jobs WHERE checkpoint_json LIKE ANY "
    "(SELECT '%' || s || '%' FROM unnest($1::text[]) s)"
)
SQL_PRUNE_ARTIFACTS = (  # $1 cutoff, $2 sha256s: records no job refers to, with their bytes
    "WITH gone AS (DELETE FROM artifacts a WHERE a.sha256 = ANY($2::text[]) "
    "AND a.created_at < $1 AND NOT EXISTS (SELECT 1 FROM jobs j "
    "WHERE j.artifact_sha256 = a.sha256) RETURNING a.sha256), "
    "c AS (DELETE FROM artifact_chunks c USING gone WHERE c.sha256 = gone.sha256) "
    "SELECT count(*) FROM gone"
)
SQL_PRUNE_WORKFLOWS = (  # $1 cutoff, $2 limit
    "DELETE FROM workflows WHERE workflow_id IN (SELECT w.workflow_id FROM workflows w "
    "WHERE w.status IN ('succeeded', 'partial', 'failed', 'cancelled') "
    "AND w.finished_at < $1 AND NOT EXISTS "
    "(SELECT 1 FROM jobs j WHERE j.workflow_id = w.workflow_id) LIMIT $2)"
)
SQL_PRUNABLE = "SELECT count(*) FROM (SELECT 1 " + _PRUNE_WHERE + " LIMIT $2) x"
SQL_CHECKSUM_FAILURES = (
    "SELECT coalesce(checksum_failures, 0) FROM pg_stat_database "
    "WHERE datname = current_database()"
)
SQL_ORPHAN_HOLDS = (  # fleet-limit holds kept by trigger, not by a foreign key
    "SELECT count(*) FROM limit_holds h WHERE NOT EXISTS "
    "(SELECT 1 FROM leases l WHERE l.job_id = h.job_id)"
)
PG_INVARIANTS = INVARIANTS + (
    ("artifact(s) whose stored bytes do not add up to their size",
     "SELECT count(*) FROM artifacts a WHERE a.path LIKE '" + PATH_PREFIX + "%' "
     "AND a.size <> (SELECT coalesce(sum(octet_length(c.data)), 0) "
     "FROM artifact_chunks c WHERE c.sha256 = a.sha256)"),
)
SQL_DB_SIZE = "SELECT pg_database_size(current_database())"


class MaintenancePostgres:
    """MaintenanceStore over PostgresStore's pool (`self._conn()`); see the module
    docstring."""

    _conn: Any

    async def prune_jobs(self, cutoff: float, limit: int = PRUNE_BATCH, *,
                         now: float | None = None) -> tuple[int, int]:
        """One batch in one transaction (see the module docstring)."""
        async with self._conn() as conn, conn.transaction():
            n, shas = await conn.fetchrow(SQL_PRUNE_JOBS, cutoff, limit)
            if not shas:
                return n, 0
            named = {sha for (rec,) in await conn.fetch(SQL_NAMED_BY_CHECKPOINTS, shas)
                     for sha, _ in checkpoint_refs(rec)}
            free = sorted(set(shas) - named)
            return n, (await conn.fetchval(SQL_PRUNE_ARTIFACTS, cutoff, free) if free else 0)

    async def prune_workflows(self, cutoff: float, limit: int = WORKFLOW_PRUNE_BATCH, *,
                              now: float | None = None) -> int:
        async with self._conn() as conn:
            return int((await conn.execute(SQL_PRUNE_WORKFLOWS, cutoff, limit)).split()[-1])

    async def prunable(self, cutoff: float, most: int = PRUNABLE_COUNTED_MAX) -> int:
        async with self._conn() as conn:
            return await conn.fetchval(SQL_PRUNABLE, cutoff, most)

    async def vacuum_step(self, *, now: float | None = None) -> int:
        """Nothing to hand back by hand: autovacuum does it."""
        return 0

    async def checkpoint_wal(self) -> None:
        """The server checkpoints its WAL itself."""

    async def optimize(self, *, now: float | None = None) -> None:
        """autoanalyze refreshes the planner's statistics."""

    async def integrity_check(self) -> Integrity:
        """Checksum failures the server met, orphan limit holds, the invariants (one
        repeatable-read snapshot)."""
        async with self._conn() as conn, conn.transaction(isolation="repeatable_read",
                                                          readonly=True):
            failures = await conn.fetchval(SQL_CHECKSUM_FAILURES) or 0
            orphans = await conn.fetchval(SQL_ORPHAN_HOLDS)
            counts = [await conn.fetchval(sql) for _, sql in PG_INVARIANTS]
        qc = "ok" if not failures else f"{failures} page checksum failure(s) (pg_stat_database)"
        return Integrity(quick_check=qc, foreign_key_violations=orphans,
                         invariants=invariant_problems(counts, PG_INVARIANTS))

    async def storage_bytes(self) -> tuple[int, int]:
        async with self._conn() as conn:
            return await conn.fetchval(SQL_DB_SIZE), 0

    async def backup(self, dest: str, *, now: float | None = None) -> BackupResult:
        """Refused: errors.InvalidState naming pg_dump (BACKUP_REFUSED)."""
        raise errors.InvalidState(BACKUP_REFUSED)

    def maintenance_window(self) -> AbstractContextManager[None]:
        """Nothing to do: the pool has one queue, no lanes (MaintenanceStore's docstring)."""
        return contextlib.nullcontext()
