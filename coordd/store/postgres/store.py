"""PostgresStore: the store interface (coordd.store.api) over asyncpg.

Every invariant is in SQL on the database's clock (coordd.store.postgres.sql): claims
with FOR UPDATE SKIP LOCKED, fences in the same statement as the write, an idempotent
reaper. Claims (coordd.store.postgres.claims), renews and completes are batched per
operation (coordd.store.postgres.batch).
The rule not to break: never read the time in Python for a decision the database makes;
pass the pinned `now` (None in production) through to the statement.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Literal

import asyncpg

from coordd import errors
from coordd.rules.claim_policy import ClaimPolicy
from coordd.wire.protocol import (
    ClaimResult, CompleteResult, EnqueueResult, HeartbeatResult, JobList, JobView,
    RenewResult,
)
from coordd.store import NewJob, dumps
from coordd.store.api import JobFilter, LeaseRef, StoreStatus
from coordd.store.postgres import apply, batch, claims, coordination, reads, schema, sql
from coordd.store.postgres import admission, workflows
from coordd.store.postgres.artifacts import ArtifactOps
from coordd.store.postgres.eager import EAGER_IN_FLIGHT_DEFAULT, EagerPostgres, worker_of
from coordd.store.postgres.enrol import EnrolOps
from coordd.store.postgres.fence import Raced, refusal
from coordd.store.postgres.hub import HubOps
from coordd.store.postgres.logs import LogOps
from coordd.store.postgres.maintenance import MaintenancePostgres
from coordd.store.postgres.schedules import SchedulesPostgres
from coordd.store.postgres.waits import WaitReadsPostgres
from coordd.store.postgres.web import WebReadsPostgres
from coordd.store.postgres.beats import BeatsPostgres
from coordd.store.postgres.lease_ends import LeaseEndsPostgres
from coordd.store.postgres.governance import GovernancePostgres
from coordd.store.postgres.hooks import PostgresServing
from coordd.store.postgres.resources import ResourcesPostgres
from coordd.store.postgres.limits import PostgresAdmission, attach, complete_checked

logger = logging.getLogger(__name__)
POOL_MIN_DEFAULT = 2
POOL_MAX_DEFAULT = 8
ACQUIRE_TIMEOUT_DEFAULT_S = 10.0
# the server went away or gave up on the statement (class 08, and class 57: a statement
# timeout, a terminated backend, a shutdown or crash restart): nothing of it was stored
_UNAVAILABLE = (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
                asyncpg.OperatorInterventionError)


class PostgresStore(EagerPostgres, LeaseEndsPostgres, HubOps, LogOps, EnrolOps, BeatsPostgres,
                    GovernancePostgres, ResourcesPostgres, PostgresAdmission,
                    workflows.PostgresWorkflows, ArtifactOps, WaitReadsPostgres,
                    SchedulesPostgres, MaintenancePostgres, WebReadsPostgres,
                    PostgresServing):
    """The store over one PostgreSQL database (schema migrated on `start`).

    Args:
        dsn: a libpq connection string or URI (connect directly, not through a
            transaction pooler: LISTEN and session advisory locks need a session).
        pool_min, pool_max: the asyncpg pool's size.
        batch_items, batch_in_flight: per-operation batching (coordd.store.postgres.batch).
        eager_in_flight: statements of completes with a next claim running at once (the
            others batch behind them; coordd.store.postgres.eager).
        aging_s: priority aging shown by the views (claims age by their ClaimPolicy).
        acquire_timeout_s: how long a call waits for a free pool connection before it is
            refused `overloaded` (the store's backpressure).
        server_settings: PostgreSQL settings of every pool session (coordd: leader.pool_settings).

    Fleet limits, priority aging, per-job gate overrides, resource requests (in any
    combination) and result schemas: coordd.store.postgres.admission, .resources and
    .limits. The hub, job logs and enrolment tokens:
    coordd.store.postgres.hub, logs, enrol; governance and resources: .governance,
    .resources; workflows: .workflows; artifacts, maintenance and schedules: .artifacts,
    .maintenance, .schedules; fail, release, reap, cancel, retry: .lease_ends; the
    governed heartbeat: .beats; the parked claims' wake-ups: .hooks.
    """

    clock: Literal["app", "db"] = "db"
    name = "PostgreSQL"

    def __init__(self, dsn: str, *, pool_min: int = POOL_MIN_DEFAULT,
                 pool_max: int = POOL_MAX_DEFAULT, batch_items: int = batch.MAX_ITEMS_DEFAULT,
                 batch_in_flight: int = batch.MAX_IN_FLIGHT_DEFAULT,
                 eager_in_flight: int = EAGER_IN_FLIGHT_DEFAULT, aging_s: float = 0.0,
                 acquire_timeout_s: float = ACQUIRE_TIMEOUT_DEFAULT_S,
                 server_settings: dict[str, str] | None = None) -> None:
        self.dsn = dsn
        self.server_settings = dict(server_settings or {})
        self._acquire_timeout_s = acquire_timeout_s
        self._pool_min, self._pool_max = pool_min, pool_max
        self._aging_s = aging_s
        self.pool: Any = None
        self.renews = batch.Batcher(self._renew_batch, _job_of, max_items=batch_items,
                                    max_in_flight=batch_in_flight)
        self.completes = batch.Batcher(self._complete_batch, _job_of, max_items=batch_items,
                                       max_in_flight=batch_in_flight)
        self.completes_next = batch.Batcher(self._complete_next_batch, worker_of,
                                            max_items=batch_items,
                                            max_in_flight=eager_in_flight)
        self.eager_paths = {"statement": 0, "transaction": 0}
        self._listener = coordination.WorkListener(dsn)
        self._wanted: dict[str, float] = {}  # the parked calls' wake-ups (postgres.waits)
        self.claims = claims.Claims(self._conn, max_items=batch_items,
                                    max_in_flight=batch_in_flight)

    async def start(self) -> None:
        """Open the pool and migrate the schema.

        Raises: errors.Unavailable (cannot connect), errors.StoreError (a newer schema,
            a database that is not coordd's, a migration the server refuses).
        """
        try:
            self.pool = await asyncpg.create_pool(self.dsn, min_size=self._pool_min,
                                                  max_size=self._pool_max, reset=_no_reset,
                                                  server_settings=self.server_settings or None)
        except _UNAVAILABLE as exc:
            raise errors.Unavailable(f"postgresql: {exc}") from exc
        try:
            async with self._conn() as conn:
                await schema.migrate(conn)
            self.claims.gated = await self._gated_waiting()
            self._resources_seen = None
            await self.resources_seen()
            await self.start_wakeups()
        except BaseException as exc:
            pool, self.pool = self.pool, None
            pool.terminate()  # a start that fails leaves no session behind
            if isinstance(exc, asyncpg.PostgresError):
                raise errors.StoreError(f"postgresql: cannot migrate the schema: {exc}") \
                    from exc
            raise

    async def close(self) -> None:
        """Run what is batched, then close the listener and the pool. Idempotent."""
        await self.stop_wakeups()
        for batcher in (self.claims.batcher, self.renews, self.completes,
                        self.completes_next):
            await batcher.drain()
        await self._listener.close()
        if self.pool is not None:
            pool, self.pool = self.pool, None
            await pool.close()

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[Any]:
        """A pool connection; none free within the timeout is `overloaded`, a lost server
        `unavailable`, a value PostgreSQL refuses `bad_request`."""
        pool = self.pool
        if pool is None:
            raise errors.CoordError("store is not started")
        try:
            conn = await pool.acquire(timeout=self._acquire_timeout_s)
        except TimeoutError as exc:
            raise errors.Overloaded(f"no PostgreSQL connection free within "
                                    f"{self._acquire_timeout_s:g}s ({self._pool_max} in the "
                                    "pool); retry later") from exc
        except _UNAVAILABLE as exc:
            raise errors.Unavailable(f"postgresql: {exc}") from exc
        try:
            yield conn
        except (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError) as exc:
            raise errors.BadRequest(f"postgresql refused the values: {exc}") from exc
        except _UNAVAILABLE as exc:
            raise errors.Unavailable(f"postgresql: {exc}") from exc
        except asyncpg.TransactionRollbackError as exc:  # class 40: nothing of it stored
            raise errors.Unavailable("postgresql rolled the transaction back "
                                     f"({getattr(exc, 'message', exc)}); "
                                     "retry") from exc
        except asyncpg.InternalClientError as exc:  # a protocol a lost backend confused
            conn.terminate()  # (never handed out again)
            raise errors.Unavailable(f"postgresql connection lost: {exc}") from exc
        finally:  # a reset that fails drops the connection; what the block did stands
            try:
                await pool.release(conn)
            except Exception as exc:
                logger.warning("PostgreSQL connection dropped on release: %s", exc,
                               extra={"action": "pg_release_failed"})

    async def truncate(self) -> None:
        """Empty every table (tests)."""
        async with self._conn() as conn:
            await conn.execute(schema.SQL_TRUNCATE)

    # ------------------------------------------------------------ workers, producers

    async def heartbeat(self, worker_id: str, roles: Sequence[str], readings: dict[str, Any],
                        *, now: float | None = None) -> HeartbeatResult:
        """Record the worker's roles and readings on the database's clock; return the jobs
        it holds whose cancel was requested."""
        async with self._conn() as conn:
            t, cancel = await conn.fetchrow(sql.SQL_HEARTBEAT, now, worker_id,
                                            dumps(sorted(set(roles))), dumps(readings))
        self.beat_stored(worker_id, roles)
        return HeartbeatResult(now=t, cancel=list(cancel))

    async def enqueue(self, jobs: Sequence[NewJob], *, indexed: bool = False,
                      now: float | None = None) -> list[EnqueueResult]:
        """Insert the jobs in one transaction (one statement), all or none; a repeated
        idempotency key returns the existing job (created=False). `indexed`: an error's
        message names the job's index (`jobs[3]: ...`).

        Raises: errors.InvalidState (the key names a job of another request).
        """
        try:
            return await self._enqueue(jobs, now)
        except _Indexed as exc:
            raise errors.batch_item(exc.index, exc.error) if indexed else exc.error

    async def _enqueue(self, jobs: Sequence[NewJob], now: float | None
                       ) -> list[EnqueueResult]:
        cols = [[getattr(j, f) for j in jobs] for f in (
            "job_id", "kind", "required_role", "priority", "payload_json", "max_attempts",
            "run_at", "delay_s", "idempotency_key", "max_runtime_s", "gates_json",
            "result_schema", "request_sha256")]
        async with self._conn() as conn, conn.transaction():
            created = {r[0] for r in await conn.fetch(sql.SQL_ENQUEUE, now, *cols)}
            repeats = [j for j in jobs if j.job_id not in created]
            known = {}
            if repeats:
                known = {r[0]: (r[1], r[2]) for r in await conn.fetch(
                    sql.SQL_BY_KEYS, [j.idempotency_key for j in repeats])}
            out = []
            for i, j in enumerate(jobs):
                if j.job_id in created:
                    out.append(EnqueueResult(job_id=j.job_id, created=True))
                    continue
                existing, stored = known.get(j.idempotency_key, (None, None))
                if existing is None:
                    raise _Indexed(i, errors.InvalidState(
                        f"job {j.job_id}: not stored (id taken)"))
                if stored is not None and stored != j.request_sha256:
                    raise _Indexed(i, errors.InvalidState(
                        f"idempotency key {j.idempotency_key!r} is taken by job {existing}, "
                        "made by another request; a new job needs a new key"))
                out.append(EnqueueResult(job_id=existing, created=False))
            if created:
                fresh = [j for j in jobs if j.job_id in created]
                await self.store_requests(conn, fresh)
                await attach(conn, fresh)
        if any(j.gates_json is not None and j.job_id in created for j in jobs):
            self.claims.gated = True  # claims judge per-job gates from now on
        return out

    # ------------------------------------------------------------ claim

    async def claim(self, worker_id: str, lease_s: float, policy: ClaimPolicy, *,
                    kinds: Sequence[str] | None = None, claim_id: str | None = None,
                    now: float | None = None) -> ClaimResult:
        """The best job for the worker under a new lease: strict priority, then queued_at,
        then job id, among waiting jobs due by the database's clock whose role (and kind)
        the worker takes, at the priorities its last readings pass (coordd.rules.gate_decision).

        With `policy.limits` defined, aging on, a job with its own gates waiting or
        resources asked for (by a job, or a worker's kind defaults), the order is by
        effective priority and each candidate is judged on its gates, resources and
        limits, in any combination (coordd.store.postgres.admission). A repeated
        `claim_id` returns the lease it granted while that lease lives. A job whose stored
        payload or checkpoint does not decode is dead-lettered on the way.
        """
        seen = await self.resources_seen()
        admitted = admission.needed(policy, self.claims.gated) or seen
        if self.reservation_hint.maybe and not admitted:  # preemption's reservations first
            reserved = await self.reserved_claim(worker_id, lease_s, claim_id,
                                                 policy.heartbeat_stale_s, now, kinds)
            if reserved is not None:
                return reserved
        return await self.claims.claim(worker_id, lease_s, policy, kinds, claim_id, now,
                                       reservations=self.reservation_hint if admitted
                                       else None, resources_seen=seen)

    # ------------------------------------------------------------ lease holder calls

    async def renew(self, ref: LeaseRef, lease_s: float, *,
                    now: float | None = None) -> RenewResult:
        """Extend the lease to now + lease_s (fenced; refused past the job's max runtime)."""
        return await self.renews.submit(now, (ref, lease_s))

    async def _renew_batch(self, now: float | None, items: list[Any]) -> list[Any]:
        async with self._conn() as conn:
            rows = await conn.fetch(sql.SQL_RENEW_BATCH, now, *_refs(r for r, _ in items),
                                    [s for _, s in items])
            got = {r[0]: r for r in rows}
            out: list[Any] = []
            for ref, _ in items:
                r = got.get(ref.job_id)
                out.append(RenewResult(expires_at=r[1], lease_s=r[2], cancel_requested=r[3])
                           if r is not None else await refusal(conn, now, ref, renew=True))
            return out

    async def complete(self, ref: LeaseRef, result_json: str | None, *,
                       artifact: Any = None, now: float | None = None,
                       then: Any = None) -> CompleteResult:
        """Store the result and end the job `succeeded` (`cancelled`, the result dropped,
        when a cancel was requested). Fenced; a resend under the same lease after success
        raises errors.AlreadyCompleted. An `artifact` (stored already by `artifact_put`)
        is recorded in one transaction of its own (limits.complete_checked); raises
        errors.BadRequest where it is not in the store. `then`: the next claim, in the
        same transaction where it can (coordd.store.postgres.eager; else `next` None)."""
        if artifact is not None:
            async with self._conn() as conn, conn.transaction():
                return await complete_checked(conn, now, ref, result_json,
                                              self._result_backoff(), artifact)
        if then is not None and await self.in_report(then):
            return await self.completes_next.submit(now, (ref, result_json, then))
        return await self.completes.submit(now, (ref, result_json))

    async def _complete_batch(self, now: float | None, items: list[Any]) -> list[Any]:
        async with self._conn() as conn:
            rows = await conn.fetch(sql.SQL_COMPLETE_BATCH, now, *_refs(r for r, _ in items),
                                    [res for _, res in items], *apply.COMPLETE_TEXTS)
            got = {r[0]: r[1] for r in rows}
            out: list[Any] = []
            for ref, res in items:
                status = got.get(ref.job_id)
                out.append(CompleteResult(status=status) if status is not None
                           else await self._complete_one(conn, now, ref, res))
            return out

    async def _complete_one(self, conn: Any, now: float | None, ref: LeaseRef,
                            result_json: str | None) -> Any:
        """A complete the batch did not match: the fencing error; else (the lease is live)
        a workflow node or a job with a result schema, decided in Python and, for a node,
        settled in the same transaction (coordd.store.postgres.limits.complete_checked)."""
        err = await refusal(conn, now, ref)
        if not isinstance(err, Raced):
            return err
        try:
            async with conn.transaction():
                return await complete_checked(conn, now, ref, result_json,
                                              self._result_backoff())
        except errors.CoordError as exc:
            return exc

    # ------------------------------------------------------------ reads, coordination

    async def get_job(self, job_id: str, *, now: float | None = None) -> JobView:
        async with self._conn() as conn:
            return await reads.get_job(conn, now, job_id, self._aging_s)

    async def list_jobs(self, flt: JobFilter, *, now: float | None = None) -> JobList:
        async with self._conn() as conn:
            return await reads.list_jobs(conn, now, flt, self._aging_s)

    async def status(self, stale_s: float, *, prune_before: float | None = None,
                     now: float | None = None) -> StoreStatus:
        """The counts, the database's size (`storage_bytes`) and how many jobs a prune
        at `prune_before` would delete (`prunable`, counted up to its cap)."""
        async with self._conn() as conn:
            st = await reads.status(conn, now, stale_s)
        st.db_bytes, st.wal_bytes = await self.storage_bytes()
        if prune_before is not None:
            st.prunable = await self.prunable(prune_before)
        return st

    async def oldest_waiting(self, levels: Sequence[int], per_level: int, *,
                             now: float | None = None) -> tuple[float, list[Any]]:
        async with self._conn() as conn:
            return await reads.oldest_waiting(conn, now, list(levels), per_level,
                                              self._aging_s)

    async def wait_for_work(self, timeout: float) -> bool:
        """True on a NOTIFY (a job entered waiting), False at `timeout` (then poll)."""
        return await self._listener.wait(timeout)

    def leadership(self, key: str = "coordd", on_lost: Callable[[], None] | None = None
                   ) -> contextlib.AbstractAsyncContextManager[bool]:
        """A session advisory lock on its own connection (coordination.leadership);
        `on_lost` is called if its session ends while the block holds it."""
        return coordination.leadership(self.dsn, key, on_lost)


async def _no_reset(_conn: Any) -> None:
    """Skip the pool's reset query on release (a round trip per acquire): these sessions
    never LISTEN, SET or lock (asyncpg still ends an open transaction itself)."""


def _job_of(item: tuple[LeaseRef, Any]) -> str:
    return item[0].job_id


def _refs(refs: Any) -> tuple[list[str], list[str], list[int]]:
    refs = list(refs)
    return [r.job_id for r in refs], [r.worker_id for r in refs], [r.token for r in refs]


class _Indexed(Exception):
    """`error` about job `index` of an enqueue (named in the message where `indexed`)."""

    def __init__(self, index: int, error: errors.CoordError) -> None:
        super().__init__(error.message)
        self.index, self.error = index, error
