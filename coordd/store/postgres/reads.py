"""PostgresStore's reads: one job, a keyset page of jobs, the status counts.

Rows have the columns of coordd.store.reads.SQL_JOB_ROW, so the views are built by the
same code as SQLite's (coordd.store.views): a job looks the same from either store.
"""

from __future__ import annotations

from typing import Any

from coordd import errors
from coordd.store import views
from coordd.wire.protocol import EventView, JobList, JobView
from coordd.store.api import JobFilter, StoreStatus
from coordd.store.postgres import sql

COUNT_SHARD_ROWS_MAX = 1024  # job_counts rows `status` reads before it folds old shards


async def get_job(conn: Any, now: float | None, job_id: str, aging_s: float) -> JobView:
    """One job with its lease and event log. Raises: errors.NotFound."""
    row = await conn.fetchrow(sql.SQL_GET_JOB, now, job_id)
    if row is None:
        raise errors.NotFound(f"job {job_id} not found")
    events = [EventView(at=r[0], from_status=r[1], to_status=r[2], worker_id=r[3], reason=r[4])
              for r in await conn.fetch(sql.SQL_EVENTS, job_id)]
    return views._job_view(tuple(row)[:-1], row[-1], aging_s, events)


async def list_jobs(conn: Any, now: float | None, flt: JobFilter, aging_s: float) -> JobList:
    """A page of jobs in enqueue (job id) order after `flt.after` (before it, newest first).

    Raises: errors.NotFound (`after` names no job).
    """
    if flt.after is not None and await conn.fetchval(sql.SQL_JOB_EXISTS, flt.after) is None:
        raise errors.NotFound(f"job {flt.after} not found (the page's `after`)")
    stmt = sql.SQL_LIST_JOBS_NEWEST if flt.newest_first else sql.SQL_LIST_JOBS
    rows = await conn.fetch(stmt, now, flt.status, flt.kind, flt.role, flt.priority,
                            flt.after, flt.limit)
    jobs = [views._job_view(tuple(r)[:-1], r[-1], aging_s) for r in rows]
    return JobList(jobs=jobs, next_after=jobs[-1].job_id if len(jobs) == flt.limit else None)


async def status(conn: Any, now: float | None, stale_s: float) -> StoreStatus:
    """Workers (all, live), live leases, jobs by status and waiting by priority, from the
    counts the writes keep (schema MIGRATION_JOB_COUNTS; running jobs: their leases), in
    one snapshot, no scan of jobs. Past COUNT_SHARD_ROWS_MAX counter rows, the shards of
    sessions gone are folded first."""
    async with conn.transaction(isolation="repeatable_read"):
        rows = await conn.fetch(sql.SQL_COUNTS)
        workers, live, leases, oldest = await conn.fetchrow(sql.SQL_STATUS_LIVE, now, stale_s)
    if rows and rows[0][3] > COUNT_SHARD_ROWS_MAX:
        await conn.execute(sql.SQL_FOLD_COUNTS)
    counts = {(s, p): n for s, p, n, _ in rows if n}
    jobs, waiting = views.counts_view(counts)
    jobs["running"] = leases
    return StoreStatus(workers=workers, workers_live=live, active_leases=leases, jobs=jobs,
                       waiting_by_priority=waiting, oldest_waiting_age_s=oldest)


async def oldest_waiting(conn: Any, now: float | None, levels: list[int], per_level: int,
                         aging_s: float) -> tuple[float, list[tuple[float, JobView]]]:
    """(NOW, [(ready time, view)]) of the `per_level` oldest due waiting jobs of each
    level in `levels` (coordd.store.waiting_heads.oldest_due's answer)."""
    t = await conn.fetchval(sql.SQL_NOW, now)
    heads = []
    for p in levels:
        for r in await conn.fetch(sql.SQL_OLDEST_DUE, now, p, per_level):
            heads.append((max(r[8], r[7]), views._job_view(tuple(r)[:-1], r[-1], aging_s)))
    return t, heads
