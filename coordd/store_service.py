"""The core operations over the store interface (coordd.store.api): what coordd serves on
a PostgreSQL store.

`StoreCoordinator` has the SQLite Coordinator's method names, params and results for the
core (heartbeat, claim with `wait_s`, renew, checkpoint, complete, fail, release, enqueue,
enqueue_batch, cancel, retry, reap, get_job, list_jobs, status), the hub's
(coordd.store_service_hub), job logs' (coordd.store_service_logs), enrolment's
(coordd.store_service_enrol), governance's (heartbeat, renew, goodbye, workers, metrics:
coordd.store_service_governance), workflows' (coordd.store_service_workflows), fleet
limits' (coordd.store_service_limits) and the same checks (coordd.intake, coordd.values,
the Coordinator's own helpers, coordd.hub, coordd.logs, coordd.enrol, coordd.workflows,
coordd.limit_service). Every other RPC
method is answered `unknown_method` with "not available on the PostgreSQL store yet":
clients already treat that code as "this coordd does not serve it" and fall back (the
worker's control watch to renewals, release to fail). Time is the database's: `now` is
never passed in production.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

from coordd import (
    errors, intake, leases, store, store_service_governance, values, waiting_report,
)
from coordd.clock import Clock, anchored
from coordd.config import Config
from coordd.ids import JobIds
from coordd.lifecycle import _clip
from coordd.names import check_name
from coordd.protocol import (
    JOB_STATUSES, Checkpoint, Claim, ClaimResult, Complete, CompleteResult, Empty, Enqueue,
    EnqueueBatch, EnqueueBatchResult, EnqueueResult, Fail, GetJob, JobId, JobList, JobView,
    ListJobs, ReapResult, StatusReply, StatusResult,
)
from coordd.protocol_workers import Release
from coordd.push import PARK_SCOPE
from coordd.service import LIST_LIMIT_MAX, Coordinator, _truncate
from coordd.store.api import JobFilter, LeaseRef, Store
from coordd.store_service_enrol import ENROL_METHODS, EnrolService
from coordd.store_service_hub import HUB_METHODS, HubService
from coordd.store_service_logs import LOG_METHODS, LogService
from coordd.store_service_governance import GovernanceService
from coordd.store_service_workflows import WORKFLOW_METHODS, WorkflowService
from coordd.store_service_limits import LIMIT_METHODS, StoreLimits

logger = logging.getLogger(__name__)

SERVED = HUB_METHODS | LOG_METHODS | ENROL_METHODS | frozenset({
    "heartbeat", "claim", "renew", "checkpoint", "complete", "fail", "release", "enqueue",
    "enqueue_batch", "cancel", "retry", "reap", "get_job", "list_jobs", "status",
    *store_service_governance.METHODS, *WORKFLOW_METHODS, *LIMIT_METHODS})
"""The RPC methods served over the store interface; the rest are refused (`refusal`)."""

POLL_S = 1.0  # a parked claim looks again at least this often (NOTIFY is only a hint)
REAP_LIMIT = 1000
JOB_ID_CHARS = 16  # coordd.ids: 16 hex characters


def refusal(method: str) -> errors.UnknownMethod:
    """The error for a method this coordd does not serve on its store."""
    if method == "backup":
        return errors.UnknownMethod("backup: use pg_dump on a PostgreSQL store")
    return errors.UnknownMethod(f"{method}: not available on the PostgreSQL store yet")


class StoreCoordinator(HubService, LogService, EnrolService, GovernanceService,
                       WorkflowService, StoreLimits):
    """The core RPC methods over one `Store` (see the module docstring).

    Args:
        st: a Store (PostgresStore in production), not yet started.
        config: limits, defaults and gate policies (the same keys as on SQLite).
        clock: coordd's clock: job ids and `delay_s` checks only (the store's decides).
    """

    # the SQLite Coordinator's own checks, shared as they are (they read config, clock,
    # _policies, _ids and _rng only)
    check_gates = Coordinator.check_gates
    new_job_id = Coordinator.new_job_id
    _lease_s = Coordinator._lease_s
    _backoff = Coordinator._backoff

    def __init__(self, st: Store, config: Config, clock: Clock,
                 rng: random.Random | None = None) -> None:
        self.store = st
        self.config = config
        self.clock = anchored(clock)
        self._rng = rng or random.Random()
        self._ids = JobIds()
        self._policies = config.policies()
        self.limit_book = config.limit_book()
        self._claim_policy = leases.ClaimPolicy(
            policies=self._policies, heartbeat_stale_s=config.heartbeat_stale_s,
            aging_interval_s=config.aging_interval_s, limits=self.limit_book)
        self._work = asyncio.Event()  # set (and replaced) when a job may be claimable
        self._closing = asyncio.Event()
        self._parked = 0
        self._pump: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the store and the wake-up pump. Raises: errors.Unavailable, StoreError."""
        await self.store.start()
        await self.load_limits()  # runtime overrides kept in the database
        self._pump = asyncio.create_task(self._pump_wakeups(), name="store-wakeups")

    def answer_parked(self) -> None:
        """Answer every parked claim now (shutdown), and park no more."""
        self._closing.set()
        self._wake()

    async def close(self) -> None:
        """Answer every parked claim, then close the store (batches run first). Idempotent."""
        self.answer_parked()
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
            self._pump = None
        await self.store.close()

    async def handle(self, method: str, params: Any) -> Any:
        """Run the RPC `method` (Dispatcher handler). Raises: what the method raises;
        errors.UnknownMethod for a method not served on this store."""
        if method not in SERVED:
            raise refusal(method)
        return await getattr(self, method)(params)

    def resources_seen(self) -> None:
        """A job asked for resources (intake): the store notices at enqueue (PostgresStore
        admits every claim from then on, coordd.store.postgres.resources)."""

    # ------------------------------------------------------------ workers

    async def claim(self, p: Claim) -> ClaimResult:
        """The best job for the worker; with `wait_s` and nothing to hand out it is parked
        (woken by the store's NOTIFY, polled every POLL_S) up to `wait_s`, cut to
        `park_wait_max_s`. Raises: BadRequest, Overloaded (past `park_max_total`)."""
        check_name("worker_id", p.worker_id)
        if p.claim_id is not None:
            check_name("claim_id", p.claim_id)
        if not p.wait_s >= 0:
            raise errors.BadRequest(f"wait_s must be a number of seconds >= 0, got {p.wait_s!r}")
        lease_s = self._lease_s(p.lease_s)
        wait = min(float(p.wait_s), self.config.park_wait_max_s)
        start = self.clock.mono()
        work = self._work
        res = await self.store.claim(p.worker_id, lease_s, self._claim_policy, kinds=p.kinds,
                                     claim_id=p.claim_id)
        if res.job is not None or wait <= 0:
            return res
        if self._parked >= self.config.park_max_total:
            raise errors.Overloaded(f"{self._parked} calls parked (park_max_total); retry later")
        scope = PARK_SCOPE.get()
        self._parked += 1
        try:
            while True:
                left = start + wait - self.clock.mono()
                if left <= 0 or self._closing.is_set() or (scope is not None and scope.closed):
                    return res
                try:
                    await asyncio.wait_for(work.wait(), min(left, POLL_S))
                except TimeoutError:
                    pass
                if self._closing.is_set() or (scope is not None and scope.closed):
                    return res  # the peer is gone (or coordd stops): grant nothing
                work = self._work
                waited = self.clock.mono() - start
                res = await self.store.claim(p.worker_id, lease_s, self._claim_policy,
                                             kinds=p.kinds, claim_id=p.claim_id)
                if res.job is not None:
                    res.waited_s = waited
                    return res
        finally:
            self._parked -= 1

    def _wake(self) -> None:
        work, self._work = self._work, asyncio.Event()
        work.set()

    async def _pump_wakeups(self) -> None:
        """Turn the store's wake-ups (LISTEN) into one wake of every parked claim."""
        while True:
            try:
                if await self.store.wait_for_work(POLL_S):
                    self._wake()
            except Exception as exc:  # the listener connection failed: poll meanwhile
                logger.warning("store wake-ups: %s (parked claims poll)", exc,
                               extra={"action": "wakeups_failed"})
                await asyncio.sleep(POLL_S)

    # ------------------------------------------------------------ lease holders

    async def checkpoint(self, p: Checkpoint) -> dict[str, Any]:
        """Record a job's latest checkpoint. Raises: PayloadTooLarge and the lease errors."""
        text = values.encode("checkpoint", p.checkpoint, self.config.max_checkpoint_bytes)
        await self.store.checkpoint(_ref(p), text)
        return {}

    async def complete(self, p: Complete) -> CompleteResult:
        """Store a job's result, once. Raises: as on SQLite; BadRequest for an artifact
        reference (no artifact store here yet). `usage` counts against limit budgets."""
        if p.artifact is not None:
            raise errors.BadRequest("complete: artifacts are not available on the "
                                    "PostgreSQL store yet (send the result inline)")
        text = values.encode("result", p.result, self.config.max_result_bytes)
        if p.usage:
            return await self.complete_usage(p, text)
        return await self.store.complete(_ref(p), text)

    async def fail(self, p: Fail) -> StatusResult:
        """Record a failure (error cut to `max_error_chars`); backoff as on SQLite."""
        error = _truncate(p.error, self.config.max_error_chars)
        return await self.store.fail(_ref(p), error, p.retryable, self._backoff())

    async def release(self, p: Release) -> StatusResult:
        """Hand a held job back without spending an attempt. Raises: the lease errors,
        BadRequest, PayloadTooLarge (checkpoint)."""
        reason = _clip(p.reason or "released", self.config.max_error_chars)
        ckpt = None if p.checkpoint is None else values.encode(
            "checkpoint", p.checkpoint, self.config.max_checkpoint_bytes)
        res = await self.store.release(_ref(p), reason, ckpt)
        logger.info("job %s released by %s: %s", p.job_id, p.worker_id, reason,
                    extra={"action": "release", "job_id": p.job_id, "worker_id": p.worker_id})
        return res

    # ------------------------------------------------------------ producers and admin

    async def enqueue(self, p: Enqueue) -> EnqueueResult:
        """Add a waiting job (checks: coordd.intake). Raises: as on SQLite, and BadRequest
        for what this store does not store yet (gates, limits, result schema)."""
        return (await self._enqueue([intake.new_job(self, p)]))[0]

    async def enqueue_batch(self, p: EnqueueBatch) -> EnqueueBatchResult:
        """Add many jobs in one transaction, all or none (errors name `jobs[i]`)."""
        jobs: list[store.NewJob] = []
        try:
            for j in p.jobs:
                jobs.append(intake.new_job(self, j))
        except errors.CoordError as exc:
            raise intake.batch_item(len(jobs), exc) from exc
        return EnqueueBatchResult(jobs=await self._enqueue(jobs))

    async def _enqueue(self, jobs: list[store.NewJob]) -> list[EnqueueResult]:
        check = getattr(self.store, "check_combinable", None)  # what the store cannot judge
        if check is not None:
            try:
                await check(jobs, self._claim_policy)
            except errors.BadRequest as exc:
                logger.info("enqueue refused: %s", exc.message,
                            extra={"action": "enqueue_refused"})
                raise
        try:
            return await self.store.enqueue(jobs)
        except errors.InvalidState as exc:
            logger.info("enqueue refused: %s", exc.message,
                        extra={"action": "idempotency_conflict"})
            raise

    async def cancel(self, p: JobId) -> StatusResult:
        """Cancel a job. Raises: NotFound, InvalidState."""
        return await self.store.cancel(p.job_id)

    async def retry(self, p: JobId) -> StatusResult:
        """Put a failed or cancelled job back to waiting. Raises: NotFound, InvalidState."""
        return await self.store.retry(p.job_id)

    async def reap(self, p: Empty | None = None) -> ReapResult:
        """Reap expired leases now (the database's clock decides). Returns how many."""
        n = await self.store.reap(limit=REAP_LIMIT)
        if n:
            logger.info("reaped %d expired lease(s)", n, extra={"action": "reap", "n": n})
        return ReapResult(reaped=n)

    # ------------------------------------------------------------ reads

    async def status(self, p: Empty | None = None) -> StatusReply:
        """Counts of workers, live leases and jobs by status (every status, zero if none)."""
        st = await self.store.status(self.config.heartbeat_stale_s)
        heads, late = await waiting_report.on_store(  # the oldest waiting, a late P0
            self.store, st.waiting_by_priority, self._policies,
            self.config.heartbeat_stale_s, self.config.warn_p0_wait_s)
        return StatusReply(workers=st.workers, workers_live=st.workers_live,
                           active_leases=st.active_leases, jobs=st.jobs,
                           waiting_by_priority=st.waiting_by_priority,
                           oldest_waiting_age_s=st.oldest_waiting_age_s,
                           now=self.clock.wall(), warnings=late, waiting=heads)

    async def get_job(self, p: GetJob | JobId) -> JobView:
        """One job with its lease and events. A `prefix` lookup takes the whole id only.
        Raises: NotFound (for a shorter `prefix` lookup, saying the whole id is needed)."""
        try:
            job = await self.annotate(await self.store.get_job(p.job_id))  # governance
        except errors.NotFound as exc:
            if getattr(p, "prefix", False) and len(p.job_id) < JOB_ID_CHARS:
                raise errors.NotFound(f"{exc.message} (the PostgreSQL store looks jobs up by "
                                      f"their whole {JOB_ID_CHARS}-character id, not a "
                                      f"prefix, yet)") from exc
            raise
        await self.annotate_limits(job)  # its limits; a full one, in its reason
        return job

    async def list_jobs(self, p: ListJobs) -> JobList:
        """A page of jobs (filters: status, kind, role, priority). Raises: BadRequest."""
        if p.status is not None and p.status not in JOB_STATUSES:
            raise errors.BadRequest(f"status must be one of {', '.join(JOB_STATUSES)}")
        return await self.store.list_jobs(JobFilter(
            status=p.status, kind=p.kind, role=p.role, priority=p.priority,
            limit=max(1, min(p.limit, LIST_LIMIT_MAX)), after=p.after,
            newest_first=p.newest_first))


def _ref(p: Any) -> LeaseRef:
    return LeaseRef(job_id=p.job_id, worker_id=p.worker_id, token=p.token)
