"""SQLiteStore: the store interface (coordd.store.api) over today's single writer.

Each write is one op on coordd.writer.Writer's queue (group commit, a savepoint per op)
calling the very functions the Coordinator calls (coordd.leases, coordd.store); reads run
on coordd.readers.ReadPool with coordd.views. `clock = "app"`: `now=None` takes the
writer's `now` (coordd's clock); a pinned `now` replaces it for that op only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

from coordd import leases, store, views, waiting_report
from coordd.clock import Clock, SystemClock
from coordd.protocol import (
    ClaimResult, CompleteResult, EnqueueResult, HeartbeatResult, JobList, JobView,
    RenewResult, StatusResult,
)
from coordd.readers import ReadPool
from coordd.store import workflows as wstore
from coordd.store.api import Backoff, JobFilter, LeaseRef, StoreStatus
from coordd.store.sqlite_artifacts import SQLiteArtifactOps
from coordd.store.sqlite_hub import SQLiteHubOps
from coordd.store.sqlite_maintenance import SQLiteMaintenance
from coordd.store.sqlite_schedules import SQLiteSchedules
from coordd.store.sqlite_waits import SQLiteWaitReads
from coordd.store.sqlite_web import SQLiteWebReads
from coordd.store.sqlite_logs import SQLiteLogOps
from coordd.store.sqlite_enrol import SQLiteEnrolOps
from coordd.store.sqlite_governance import SQLiteGovernance
from coordd.store.sqlite_workflows import SQLiteWorkflows
from coordd.store.sqlite_admission import SQLiteAdmission
from coordd.writer import Writer


def _no_backoff(_attempts: int) -> float:
    return 0.0


class SQLiteStore(SQLiteHubOps, SQLiteLogOps, SQLiteEnrolOps, SQLiteGovernance,
                  SQLiteWorkflows, SQLiteAdmission, SQLiteArtifactOps, SQLiteWaitReads,
                  SQLiteSchedules, SQLiteMaintenance, SQLiteWebReads):
    """The store over one SQLite file (created and migrated on `start`); the hub's, job
    logs', enrolment tokens', governance's, workflows' and admission's operations too
    (coordd.store.sqlite_hub, sqlite_logs, sqlite_enrol, sqlite_governance,
    sqlite_workflows, sqlite_admission).

    Args:
        path: the database file.
        clock: coordd's clock (tests pass a FakeClock; SystemClock otherwise).
        aging_s: priority aging shown by the views (0 = strict priority).
        read_connections: size of the read pool.
    """

    clock: Literal["app", "db"] = "app"

    def __init__(self, path: str, clock: Clock | None = None, *, aging_s: float = 0.0,
                 read_connections: int = 2) -> None:
        self.path = path
        self._clock = clock or SystemClock()
        self._aging_s = aging_s
        self.writer = Writer(path, self._clock)
        self.readers = ReadPool(path, read_connections)
        self._work = asyncio.Event()

    async def start(self) -> None:
        """Open the writer (migrating the schema) and the read connections.

        Raises: errors.StoreError (not a compatible coordd database).
        """
        self.writer.on_commit = self._work.set
        await self.writer.start()
        await self.readers.start()

    async def close(self) -> None:
        """Close the readers, then drain and close the writer. Idempotent."""
        try:
            await self.readers.close()
        finally:
            await self.writer.stop()

    async def _write(self, fn: Any, now: float | None, urgent: bool = False) -> Any:
        """Run `fn(conn, now)` in the writer's next group commit, `now` pinned or the writer's."""
        if now is None:
            return await self.writer.run(fn, urgent=urgent)
        return await self.writer.run(lambda conn, _now: fn(conn, now), urgent=urgent)

    def _now(self, now: float | None) -> float:
        return self._clock.wall() if now is None else now

    # ------------------------------------------------------------ writes

    async def heartbeat(self, worker_id: str, roles: Sequence[str], readings: dict[str, Any],
                        *, now: float | None = None) -> HeartbeatResult:
        """Record the worker's roles and readings (see coordd.store.heartbeat)."""
        roles_json, readings_json = store.dumps(sorted(set(roles))), store.dumps(readings)

        def op(conn: Any, t: float) -> HeartbeatResult:
            cancel = store.heartbeat(conn, t, worker_id, roles_json, readings_json)
            return HeartbeatResult(now=t, cancel=cancel)
        return await self._write(op, now, urgent=True)

    async def enqueue(self, jobs: Sequence[store.NewJob], *,
                      now: float | None = None) -> list[EnqueueResult]:
        """Insert the jobs in one transaction, all or none (coordd.store.enqueue)."""
        return await self._write(lambda conn, t: [store.enqueue(conn, t, j) for j in jobs], now)

    async def claim(self, worker_id: str, lease_s: float, policy: leases.ClaimPolicy, *,
                    kinds: Sequence[str] | None = None, claim_id: str | None = None,
                    now: float | None = None) -> ClaimResult:
        """The best job for the worker under a new lease (coordd.leases.claim)."""
        kinds_json = None if kinds is None else store.dumps(list(kinds))
        return await self._write(lambda conn, t: leases.claim(
            conn, t, worker_id, lease_s, claim_id, policy, kinds_json), now)

    async def renew(self, ref: LeaseRef, lease_s: float, *,
                    now: float | None = None) -> RenewResult:
        return await self._write(lambda conn, t: leases.renew(
            conn, t, ref.job_id, ref.worker_id, ref.token, lease_s), now, urgent=True)

    async def checkpoint(self, ref: LeaseRef, checkpoint_json: str, *,
                         now: float | None = None) -> None:
        await self._write(lambda conn, t: leases.checkpoint(
            conn, t, ref.job_id, ref.worker_id, ref.token, checkpoint_json), now, urgent=True)

    async def complete(self, ref: LeaseRef, result_json: str | None, *,
                       now: float | None = None) -> CompleteResult:
        return await self._write(lambda conn, t: leases.complete(
            conn, t, ref.job_id, ref.worker_id, ref.token, result_json, None, _no_backoff),
            now, urgent=True)

    async def fail(self, ref: LeaseRef, error: str, retryable: bool, backoff: Backoff, *,
                   now: float | None = None) -> StatusResult:
        return await self._write(lambda conn, t: leases.fail(
            conn, t, ref.job_id, ref.worker_id, ref.token, error, retryable, backoff),
            now, urgent=True)

    async def release(self, ref: LeaseRef, reason: str, checkpoint_json: str | None = None,
                      *, now: float | None = None) -> StatusResult:
        return await self._write(lambda conn, t: leases.release(
            conn, t, ref.job_id, ref.worker_id, ref.token, reason, checkpoint_json),
            now, urgent=True)

    async def reap(self, *, limit: int = 1000, now: float | None = None) -> int:
        return await self._write(lambda conn, t: store.reap_expired(conn, t, limit), now)

    async def cancel(self, job_id: str, *, now: float | None = None) -> StatusResult:
        """As the Coordinator's cancel: a workflow node's dependents follow."""
        return await self._write(lambda conn, t: wstore.cancel_job(conn, t, job_id), now)

    async def retry(self, job_id: str, *, now: float | None = None) -> StatusResult:
        """As the Coordinator's retry: a workflow node reopens its workflow."""
        return await self._write(lambda conn, t: wstore.retry_job(conn, t, job_id), now)

    # ------------------------------------------------------------ reads

    async def get_job(self, job_id: str, *, now: float | None = None) -> JobView:
        return await self.readers.run(views.get_job, self._now(now), job_id, self._aging_s)

    async def list_jobs(self, flt: JobFilter, *, now: float | None = None) -> JobList:
        jobs = await self.readers.run(lambda conn: views.list_jobs(
            conn, self._now(now), status=flt.status, kind=flt.kind, role=flt.role,
            priority=flt.priority, limit=flt.limit, after=flt.after, aging_s=self._aging_s,
            newest_first=flt.newest_first))
        return JobList(jobs=jobs, next_after=jobs[-1].job_id if len(jobs) == flt.limit else None)

    async def status(self, stale_s: float, *, now: float | None = None) -> StoreStatus:
        t = self._now(now)
        jobs, waiting = views.counts_view(self.writer.changes.counts)  # committed counts
        workers, live, active, oldest, _ = await self.readers.run(
            views.status_live, t, stale_s, float("-inf"))
        return StoreStatus(workers=workers, workers_live=live, active_leases=active, jobs=jobs,
                           waiting_by_priority=waiting, oldest_waiting_age_s=oldest)

    async def oldest_waiting(self, levels: Sequence[int], per_level: int, *,
                             now: float | None = None) -> tuple[float, list[Any]]:
        t = self._now(now)
        return t, await self.readers.run(waiting_report.oldest_due, t, list(levels),
                                         per_level, self._aging_s)

    # ------------------------------------------------------------ coordination

    async def wait_for_work(self, timeout: float) -> bool:
        """True after the writer's next commit (any commit may free a job), False at `timeout`."""
        self._work.clear()
        try:
            await asyncio.wait_for(self._work.wait(), timeout)
        except TimeoutError:
            return False
        return True

    @contextlib.asynccontextmanager
    async def leadership(self, key: str = "coordd", on_lost: Any = None
                         ) -> AsyncIterator[bool]:
        """Always won, never lost (`on_lost` is not called): one SQLite file has one
        writer, and coordd takes the file's lock at start (coordd.dblock), so a second
        coordd on it never gets this far."""
        yield True
