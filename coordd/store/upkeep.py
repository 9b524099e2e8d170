"""The SQLite file's upkeep, run by the maintenance rounds: `prune_batch` deletes the
ended jobs past retention (with their events and unreferenced artifact rows),
`vacuum_step` returns free pages to the file system, `optimize` refreshes the planner's
statistics and `wal_checkpoint` copies the WAL into the file. Each step is short (about
2 ms) so the single writer is never held long; the loops that call them are
coordd.store.sqlite.maintenance_ops and coordd.store.sqlite.checkpointer.
"""

from __future__ import annotations

import sqlite3

PRUNE_BATCH = 50  # terminal jobs deleted per transaction by `prune_batch` (~2 ms)
VACUUM_PAGES = 128  # free pages returned to the file system per transaction (~2 ms)
ANALYSIS_LIMIT = 400  # index rows ANALYZE samples per index (SQLite's advice for optimize)

# A node of a workflow goes only with its whole graph: once the workflow has ended, and
# ended before the cutoff too (so every node has), never while a dependent may still read
# its result or artifact.
SQL_PRUNE_WHERE = (
    "FROM jobs INDEXED BY jobs_finished WHERE finished_at IS NOT NULL "
    "AND finished_at < ?1 AND status IN ('succeeded', 'failed', 'cancelled', 'skipped') "
    "AND (workflow_id IS NULL OR EXISTS (SELECT 1 FROM workflows w "
    "WHERE w.workflow_id = jobs.workflow_id AND w.status <> 'running' "
    "AND w.finished_at < ?1))"
)
SQL_PRUNE_PICK = "SELECT job_id " + SQL_PRUNE_WHERE + " ORDER BY finished_at LIMIT ?2"
SQL_PRUNABLE = "SELECT count(*) " + SQL_PRUNE_WHERE
# The newest event is kept (its job may go): event ids are rowids, and a deleted maximum
# would be handed out again, under the cursor of a watch_events reader.
SQL_PRUNE_EVENTS = ("DELETE FROM job_events WHERE job_id = ? "
                    "AND event_id < (SELECT max(event_id) FROM job_events)")
SQL_PRUNE_JOB = "DELETE FROM jobs WHERE job_id = ? RETURNING artifact_sha256"
SQL_PRUNE_ARTIFACT = (
    "DELETE FROM artifacts WHERE sha256 = ?1 "
    "AND NOT EXISTS (SELECT 1 FROM jobs WHERE artifact_sha256 = ?1)"
)
SQL_FREELIST_COUNT = "PRAGMA freelist_count"
SQL_AUTO_VACUUM_MODE = "PRAGMA auto_vacuum"
AUTO_VACUUM_INCREMENTAL = 2
SQL_INCREMENTAL_VACUUM = "PRAGMA incremental_vacuum"
SQL_WAL_CHECKPOINT = "PRAGMA wal_checkpoint(PASSIVE)"
SQL_OPTIMIZE = "PRAGMA optimize"  # refreshes the planner's statistics where they went stale
SQL_ANALYSIS_LIMIT = "PRAGMA analysis_limit = {:d}"


def prune_batch(conn: sqlite3.Connection, cutoff: float, limit: int = PRUNE_BATCH
                ) -> tuple[int, int]:
    """Delete up to `limit` terminal jobs finished before `cutoff`, with their events and
    the artifact rows no remaining job references; return (jobs, artifact rows) deleted.

    The artifact files stay: another job may reference the same content-addressed file
    again before a file could be removed, so file clean-up is a separate, offline step.
    """
    ids = [r[0] for r in conn.execute(SQL_PRUNE_PICK, (cutoff, limit)).fetchall()]
    shas: set[str] = set()
    for job_id in ids:
        conn.execute(SQL_PRUNE_EVENTS, (job_id,))
        sha = conn.execute(SQL_PRUNE_JOB, (job_id,)).fetchone()[0]
        if sha is not None:
            shas.add(sha)
    artifacts = sum(conn.execute(SQL_PRUNE_ARTIFACT, (sha,)).rowcount for sha in shas)
    return len(ids), artifacts


def vacuum_step(conn: sqlite3.Connection, max_pages: int = VACUUM_PAGES) -> int:
    """Return up to `max_pages` free pages to the file system; return how many stay free.

    Python's sqlite3 steps a PRAGMA once, and each step of `incremental_vacuum` frees one
    page, hence the loop. A file without incremental auto-vacuum frees nothing (returns 0).
    """
    if conn.execute(SQL_AUTO_VACUUM_MODE).fetchone()[0] != AUTO_VACUUM_INCREMENTAL:
        return 0
    free = conn.execute(SQL_FREELIST_COUNT).fetchone()[0]
    for _ in range(min(free, max_pages)):
        conn.execute(SQL_INCREMENTAL_VACUUM)
    return conn.execute(SQL_FREELIST_COUNT).fetchone()[0]


def optimize(conn: sqlite3.Connection) -> None:
    """Run `PRAGMA optimize` (statistics for the planner, only where they went stale),
    its ANALYZE sampling ANALYSIS_LIMIT rows per index: about a millisecond at any size,
    where a full ANALYZE of 1 M jobs held the writer ~320 ms."""
    conn.execute(SQL_ANALYSIS_LIMIT.format(ANALYSIS_LIMIT))
    conn.execute(SQL_OPTIMIZE).fetchall()


def wal_checkpoint(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """Copy the WAL into the file (outside any transaction); SQLite's (busy, log frames,
    checkpointed frames). PASSIVE never waits for readers (the writer must not stall);
    when it copies every frame SQLite also cuts the file to the pages in use."""
    return tuple(conn.execute(SQL_WAL_CHECKPOINT).fetchone())
