"""SQLiteStore: the store interface (coordd.store.api) over today's single writer.

Each write is one op on coordd.store.sqlite.writer.Writer's queue (group commit, a savepoint per
op) calling the very functions the Coordinator calls (coordd.store.sqlite.leases, coordd.store);
reads run on coordd.store.sqlite.readers.ReadPool with coordd.store.views. `clock = "app"`:
`now=None` takes the writer's `now` (coordd's clock); a pinned `now` replaces it for that op
only.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from coordd import errors
from coordd.jsontext import dumps
from coordd.store import jobs as jobstore
from coordd.store import workers as wkstore
from coordd.store.sqlite import leases
from coordd.store.sqlite.claims import with_next
from coordd.rules.claim_batch import NextClaim
from coordd.store import views
from coordd.store import waiting_heads
from coordd.clock import Clock, SystemClock
from coordd.store.sqlite.dblock import DbLock
from coordd.wire.protocol import (
    ClaimResult, CompleteResult, EnqueueResult, HeartbeatResult, JobList, JobView,
    RenewResult, StatusResult,
)
from coordd.store.sqlite.readers import ReadPool
from coordd.store import workflows as wstore
from coordd.store import grace
from coordd.store import resources as resstore
from coordd.store.api import Backoff, JobFilter, LeaseRef, NewJob, StoreHooks, StoreStatus
from coordd.store.sqlite.artifacts_ops import SQLiteArtifactOps
from coordd.store.sqlite.hub_ops import SQLiteHubOps
from coordd.store.sqlite.maintenance_ops import SQLiteMaintenance, file_size
from coordd.store.sqlite.schedules_ops import SQLiteSchedules
from coordd.store.sqlite.waits_ops import SQLiteWaitReads
from coordd.store.sqlite.wakeups import SQLiteWakeups
from coordd.store.sqlite.web_ops import SQLiteWebReads
from coordd.store.sqlite.logs_ops import SQLiteLogOps
from coordd.store.sqlite.enrol_ops import SQLiteEnrolOps
from coordd.store.sqlite.governance_ops import SQLiteGovernance
from coordd.store.sqlite.workflows_ops import SQLiteWorkflows
from coordd.store.sqlite.admission_ops import SQLiteAdmission
from coordd.store.sqlite.writer import Writer

if TYPE_CHECKING:
    from coordd.config import Config


def _no_backoff(_attempts: int) -> float:
    return 0.0


class SQLiteStore(SQLiteHubOps, SQLiteLogOps, SQLiteEnrolOps, SQLiteGovernance,
                  SQLiteWorkflows, SQLiteAdmission, SQLiteArtifactOps, SQLiteWaitReads,
                  SQLiteSchedules, SQLiteMaintenance, SQLiteWebReads, SQLiteWakeups):
    """The store over one SQLite file (created and migrated on `start`); the hub's, job
    logs', enrolment tokens', governance's, workflows' and admission's operations too
    (coordd.store.sqlite.hub_ops, sqlite_logs, sqlite_enrol, sqlite_governance,
    sqlite_workflows, sqlite_admission).

    Args:
        path: the database file.
        clock: coordd's clock (tests pass a FakeClock; SystemClock otherwise).
        aging_s: priority aging shown by the views (0 = strict priority).
        read_connections: size of the read pool.
    """

    clock: Literal["app", "db"] = "app"
    name = "SQLite"
    noun = "the database"  # what coordd says it cannot open

    def __init__(self, path: str, clock: Clock | None = None, *, aging_s: float = 0.0,
                 read_connections: int = 2, read_queue_max: int | None = None,
                 busy_timeout_ms: int | None = None, **writer: Any) -> None:
        self.path = path
        self._clock = clock or SystemClock()
        self._aging_s = aging_s
        if busy_timeout_ms is not None:
            writer["busy_timeout_ms"] = busy_timeout_ms
        self.writer = Writer(path, self._clock, **writer)
        pool: dict[str, Any] = {} if read_queue_max is None else {"queue_max": read_queue_max}
        if busy_timeout_ms is not None:
            pool["busy_timeout_ms"] = busy_timeout_ms
        self.readers = ReadPool(path, read_connections, **pool)
        self._work = asyncio.Event()
        self._hooks: StoreHooks | None = None
        self.backoff_factory: Any = None  # a result failing its schema waits (attach)
        self._lock: DbLock | None = None  # the file's lock while `hold` holds it

    @classmethod
    def from_config(cls, path: str, config: Config, clock: Clock) -> "SQLiteStore":
        """The store coordd runs on `path`, sized by `config` (writer queue and batches,
        busy timeout, clock-step rules, WAL limits, read pool). `clock`: coordd's
        (anchored: the writer takes the wall clock's steps)."""
        return cls(path, clock, aging_s=config.aging_interval_s,
                   read_connections=config.read_connections,
                   read_queue_max=config.read_queue_max,
                   busy_timeout_ms=config.busy_timeout_ms,
                   queue_max=config.writer_queue_max, batch_max=config.writer_batch_max,
                   clock_jump_s=config.clock_jump_s, clock_step_s=config.clock_step_s,
                   wal_size_limit=config.wal_size_limit_bytes,
                   wal_autocheckpoint_pages=config.wal_autocheckpoint_pages,
                   checkpoint_interval_s=config.wal_checkpoint_interval_s)

    async def wait_dead(self, stop: Any) -> None:
        """Return (raising the writer's error) if the writer task dies before `stop`."""
        await self.writer.wait_dead(stop)

    @contextlib.contextmanager
    def hold(self, given: str | None = None) -> Iterator[None]:
        """Hold the database file's lock (coordd.store.sqlite.dblock: by any of its names, so no
        second coordd, nor a restore, swaps it) while the block runs; `start` inside it
        also locks the inode of a file SQLite just created.

        Raises: errors.InvalidState (the folder is missing, the path is not a regular
        file, another coordd holds the lock, its lock file cannot be made).
        """
        db = Path(given or self.path)
        if not db.parent.is_dir():
            raise errors.InvalidState(f"database folder {db.parent} does not exist")
        if db.exists() and not db.is_file():
            raise errors.InvalidState(f"database {db} is not a regular file")
        try:
            lock = DbLock(db)
        except OSError as exc:
            raise errors.InvalidState(
                f"cannot open the database {db}: cannot create its lock file "
                f"({(exc.strerror or str(exc)).lower()})") from exc
        self._lock = lock
        try:
            yield
        finally:
            self._lock = None
            lock.close()

    def attach(self, hooks: StoreHooks) -> None:
        """The coordinator's hooks: the writer wakes parked calls after each COMMIT (its
        TEMP triggers and job hook note what changed, coordd.store.sqlite.wakeups), records
        its batches in the metrics, and the claim policy reads the writer's role/kind and
        reservation hints (coordd.store.sqlite.job_changes). A lone peer's request commits
        at once (`hooks.peers`: coordd.store.sqlite.writer.Writer.submit)."""
        self._hooks = hooks
        changes = self.writer.changes
        self.attach_wakeups(hooks.push)
        self.writer.metrics = hooks.meters
        self.writer.peers = hooks.peers
        hooks.policy.role_kinds = changes.role_kinds
        hooks.policy.worker_rows = changes.worker_rows
        hooks.policy.reservations = changes.reservations = hooks.reservations
        self.backoff_factory = hooks.backoff

    def _committed(self) -> None:
        self._work.set()
        if self._hooks is not None:
            self._hooks.push.committed()

    async def start(self) -> None:
        """Open the writer (migrating the schema) and the read connections; with hooks
        attached, claims check resource requests from now on if any job asked for some.

        Raises: errors.StoreError (not a compatible coordd database).
        """
        self.writer.on_commit = self._committed
        try:
            await self.writer.start()
        except sqlite3.Error as exc:
            raise errors.StoreError(f"{self.path}: {exc}") from exc
        try:
            if self._lock is not None:
                self._lock.lock_inode()  # a file SQLite just created
            await self.readers.start()
            await asyncio.to_thread(self.make_artifact_dir)
            if self._hooks is not None and await self.readers.run(resstore.any_request):
                self._hooks.policy.resources_seen = True
        except sqlite3.Error as exc:
            await self.close()
            raise errors.StoreError(f"{self.path}: {exc}") from exc
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the readers, then drain and close the writer. Idempotent."""
        try:
            await self.readers.close()
        finally:
            await self.writer.stop()

    def _write(self, fn: Any, now: float | None, urgent: bool = False) -> Awaitable[Any]:
        """Run `fn(conn, now)` in the writer's next group commit, `now` pinned or the
        writer's; await what it returns (the writer's future) for the result. No coroutine
        of its own: a request waiting for its commit is resumed through one layer less.

        Raises: errors.Overloaded (at once, as Writer.submit)."""
        if now is None:
            return self.writer.submit(fn, urgent)
        return self.writer.submit(lambda conn, _now: fn(conn, now), urgent)

    def _now(self, now: float | None) -> float:
        return self._clock.wall() if now is None else now

    # ------------------------------------------------------------ writes

    async def heartbeat(self, worker_id: str, roles: Sequence[str], readings: dict[str, Any],
                        *, now: float | None = None) -> HeartbeatResult:
        """Record the worker's roles and readings (see coordd.store.workers.heartbeat)."""
        roles_json, readings_json = dumps(sorted(set(roles))), dumps(readings)

        def op(conn: Any, t: float) -> HeartbeatResult:
            cancel = wkstore.heartbeat(conn, t, worker_id, roles_json, readings_json)
            return HeartbeatResult(now=t, cancel=cancel)
        return await self._write(op, now, urgent=True)

    async def enqueue(self, jobs: Sequence[NewJob], *, indexed: bool = False,
                      now: float | None = None) -> list[EnqueueResult]:
        """Insert the jobs in one transaction, all or none (coordd.store.jobs.enqueue);
        `indexed`: an error's message names the job's index (`jobs[3]: ...`)."""
        if not indexed and len(jobs) == 1:
            job = jobs[0]
            return await self._write(lambda conn, t: [jobstore.enqueue(conn, t, job)], now)

        def op(conn: sqlite3.Connection, t: float) -> list[EnqueueResult]:
            out: list[EnqueueResult] = []
            try:
                for j in jobs:
                    out.append(jobstore.enqueue(conn, t, j))
            except errors.CoordError as exc:
                raise errors.batch_item(len(out), exc) if indexed else exc
            return out
        return await self._write(op, now)

    async def claim(self, worker_id: str, lease_s: float, policy: leases.ClaimPolicy, *,
                    kinds: Sequence[str] | None = None, claim_id: str | None = None,
                    now: float | None = None) -> ClaimResult:
        """The best job for the worker under a new lease (coordd.store.sqlite.leases.claim)."""
        kinds_json = None if kinds is None else dumps(list(kinds))
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
                       artifact: Any = None, now: float | None = None,
                       then: NextClaim | None = None) -> CompleteResult:
        backoff = _no_backoff if self.backoff_factory is None else self.backoff_factory()
        return await self._write(with_next(lambda conn, t: leases.complete(
            conn, t, ref.job_id, ref.worker_id, ref.token, result_json, artifact, backoff),
            then), now, urgent=True)

    async def fail(self, ref: LeaseRef, error: str, retryable: bool, backoff: Backoff, *,
                   now: float | None = None, then: NextClaim | None = None) -> StatusResult:
        return await self._write(with_next(lambda conn, t: leases.fail(
            conn, t, ref.job_id, ref.worker_id, ref.token, error, retryable, backoff),
            then), now, urgent=True)

    async def release(self, ref: LeaseRef, reason: str, checkpoint_json: str | None = None,
                      *, now: float | None = None,
                      then: NextClaim | None = None) -> StatusResult:
        return await self._write(with_next(lambda conn, t: leases.release(
            conn, t, ref.job_id, ref.worker_id, ref.token, reason, checkpoint_json),
            then), now, urgent=True)

    async def reap(self, *, limit: int = 1000, now: float | None = None) -> int:
        return await self._write(lambda conn, t: jobstore.reap_expired(conn, t, limit), now)

    async def ping(self) -> None:
        """An empty writer request (BEGIN IMMEDIATE ... COMMIT): returns once the writer
        committed it. Raises: errors.Overloaded (queue full or shutting down)."""
        await self.writer.run(lambda conn, now: None, urgent=True)

    async def restart_grace(self, *, now: float | None = None) -> int:
        """coordd.store.grace.restart_grace, one writer op."""
        return await self._write(grace.restart_grace, now)

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
            newest_first=flt.newest_first), heavy=True)
        return JobList(jobs=jobs, next_after=jobs[-1].job_id if len(jobs) == flt.limit else None)

    async def status(self, stale_s: float, *, prune_before: float | None = None,
                     now: float | None = None) -> StoreStatus:
        """The counts (jobs: the writer's committed counters), the file sizes, the
        writer's queue and its storage warning."""
        t = self._now(now)
        jobs, waiting = views.counts_view(self.writer.changes.counts)  # committed counts
        workers, live, active, oldest, prunable = await self.readers.run(
            views.status_live, t, stale_s, float("-inf") if prune_before is None
            else prune_before)
        health = self.writer.health.warning()
        return StoreStatus(workers=workers, workers_live=live, active_leases=active, jobs=jobs,
                           waiting_by_priority=waiting, oldest_waiting_age_s=oldest,
                           prunable=prunable, db_bytes=file_size(self.path),
                           wal_bytes=file_size(self.path + "-wal"),
                           queue_depth=self.writer.queue_depth,
                           warnings=[health] if health else [])

    async def oldest_waiting(self, levels: Sequence[int], per_level: int, *,
                             now: float | None = None) -> tuple[float, list[Any]]:
        t = self._now(now)
        return t, await self.readers.run(waiting_heads.oldest_due, t, list(levels),
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

    def leader(self, key: str = "coordd", session_timeout_s: float = 0.0) -> "FileLeader":
        """Always won, never lost (see `leadership`)."""
        return FileLeader()

    @contextlib.asynccontextmanager
    async def leadership(self, key: str = "coordd", on_lost: Any = None
                         ) -> AsyncIterator[bool]:
        """Always won, never lost (`on_lost` is not called): one SQLite file has one
        writer, and coordd takes the file's lock at start (coordd.store.sqlite.dblock), so a second
        coordd on it never gets this far."""
        yield True


class FileLeader:
    """The leadership of a SQLite coordd: its file's lock (coordd.store.sqlite.dblock) is taken at
    start, so whoever gets this far leads until it stops."""

    async def try_acquire(self) -> bool:
        return True

    async def acquire(self) -> None:
        return None

    async def watch(self) -> str:
        await asyncio.Event().wait()  # never lost: returns only by being cancelled
        return "never"

    async def close(self) -> None:
        return None
