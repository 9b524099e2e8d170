"""The Coordinator: the jobs' and leases' RPC methods over one store, and how the rest of the
coordinator is put together (reads: coordd.service.reads; limits and workflows:
coordd.service.areas; artifacts: coordd.service.transfers; prune and check:
coordd.service.maintenance; schedules and the workflow round: coordd.service.workflows; the web
view's reads: coordd.service.web_reads; parked calls: coordd.service.waits and
coordd.service.push).

Each method takes its params Struct from coordd.wire.protocol and returns its result Struct,
raising a `coordd.errors.CoordError` whose `code` goes on the wire. Nothing slow runs
inside a store's transaction: sizes and encodings are checked here, before the store is
asked. Time: `now` is the store's (coordd's clock on SQLite, the database's on PostgreSQL).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec

from coordd import errors
from coordd.rules import gates
from coordd.service import governor
from coordd.service import intake
from coordd.rules import values
from coordd.rules.claim_policy import ClaimPolicy
from coordd.rules.transitions import backoff_delay
from coordd.clock import Clock, anchored
from coordd.config import Config
from coordd.service.beats import Beats
from coordd.service.enrol import Enrolment
from coordd.service.hub import Hub
from coordd.ids import JobIds
from coordd.service.lifecycle import _clip, log_lost
from coordd.service.logs import JobLogStore
from coordd.ops.metrics import Metrics
from coordd.rules.names import check_id, check_name
from coordd.service.maintenance import Maintenance
from coordd.wire.protocol import (
    HUB_PARAMS, Backup, BackupResult, Checkpoint, Complete, CompleteResult, Empty, Enqueue,
    EnqueueBatch, EnqueueBatchResult, EnqueueResult, Fail, Heartbeat, HeartbeatResult, JobId,
    PruneResult, ReapResult, Renew, RenewResult, StatusResult,
)
from coordd.wire.logs import LOG_PARAMS
from coordd.wire.push import PUSH_PARAMS
from coordd.wire.web import WEB_PARAMS
from coordd.wire.workers import ForgetWorker, Goodbye, Release, ReleasedResult
from coordd.service.dispatch import Dispatch
from coordd.service.push import Push
from coordd.service.coalesced import Coalesced
from coordd.service.areas import Areas
from coordd.service.checks import lease_ref, truncate
from coordd.service.reads import Reads
from coordd.store import NewJob
from coordd.store.api import StoreHooks
from coordd.store.api_governance import Governance
from coordd.rules.times import check_duration
from coordd.service.waits import Waits
from coordd.service.web_reads import WebReads
from coordd.service.transfers import TRANSFER_METHODS, Transfers
from coordd.service.workflows import Workflows

logger = logging.getLogger(__name__)

REAP_LIMIT = 1000  # leases one reap ends at most
SCHEDULE_METHODS = ("schedule_add", "schedule_list", "schedule_remove")


class Coordinator(Dispatch, Reads, Areas):
    """Every RPC method over one store.

    Args:
        store: a SQLiteStore or a PostgresStore (coordd.store.api), not yet started.
        config: limits, defaults and gate policies.
        clock: coordd's clock (tests pin it; on SQLite the store's writer runs on it too:
            build both with the same `coordd.clock.anchored` clock).
        rng: source of backoff jitter (tests may seed it).
        peers: how many peers may send requests at once (the daemon's
            rpc.Dispatcher.peers), handed to the store (StoreHooks.peers); None: unknown.
    """

    def __init__(self, store: Any, config: Config, clock: Clock,
                 rng: random.Random | None = None,
                 peers: Callable[[], int] | None = None) -> None:
        self.store = store
        self.config = config
        self.clock = anchored(clock)
        self._rng = rng or random.Random()
        self._ids = JobIds()
        self.meters = Metrics()
        self.artifact_bytes = 0  # the artifact store's size at the last prune or scrape
        self._policies = config.policies()
        self.limit_book = config.limit_book()  # fleet-wide limits (coordd.rules.limits)
        self._claim_policy = ClaimPolicy(
            policies=self._policies, heartbeat_stale_s=config.heartbeat_stale_s,
            aging_interval_s=config.aging_interval_s, limits=self.limit_book)
        self.governance = Governance(policies=self._policies,
                                     preemptor=governor.preemptor(config))
        self.push = Push(self.clock, store, per_connection_max=config.park_max_per_connection,
                         total_max=config.park_max_total, wait_max_s=config.park_wait_max_s)
        store.attach(StoreHooks(policy=self._claim_policy,
                                reservations=self.governance.preemptor.hint,
                                push=self.push, meters=self.meters, backoff=self._backoff,
                                peers=peers))
        self._status = Coalesced(self._status_now)  # many pollers share one read
        self._queue_depth = 0
        self.hub = Hub(store, config)
        self.logs = JobLogStore(store)
        self.enrolment = Enrolment(store, config)
        self.web = WebReads(store, self.clock.wall, self.explain_waiting)
        self.waits = Waits(self.push, store, self.get_job)
        for part, methods in ((self.hub, HUB_PARAMS), (self.logs, LOG_PARAMS),
                              (self.enrolment, Enrolment.METHODS), (self.web, WEB_PARAMS),
                              (self.waits, PUSH_PARAMS)):
            for method in methods:  # served by service.hub, .logs, .enrol, .web_reads, .waits
                setattr(self, method, getattr(part, method))
        self.flows = Workflows(self)  # graphs' checks, schedules, the workflow round
        self.maintenance = Maintenance(self)  # prune, check
        self.transfers = Transfers(store, config)  # artifact_put, artifact_get
        for part, methods in ((self.flows, SCHEDULE_METHODS),
                              (self.transfers, TRANSFER_METHODS),
                              (self.maintenance, ("prune", "check"))):
            for method in methods:
                setattr(self, method, getattr(part, method))
        self.beats = Beats(self)  # heartbeats; wraps the methods that change their answers
        self.push.roles_of = self.beats.roles_of  # a parked claim's roles (push.py)

    @property
    def artifact_dir(self) -> str | None:
        """The artifact store's folder a worker on this host may write into (SQLite:
        beside the database), or None (PostgreSQL: artifacts live in the database)."""
        return self.store.artifact_dir  # type: ignore[no-any-return]

    async def start(self) -> None:
        """Open the store (creating and migrating its schema) and install the runtime
        limit overrides kept in it.

        Raises: errors.StoreError (not a compatible coordd store), errors.Unavailable.
        """
        await self.store.start()
        try:
            await self.load_limits()
        except BaseException:
            await self.close()
            raise

    def resources_seen(self) -> None:
        """A job asked for resources: claims check requests from now on
        (coordd.store.claim_admission)."""
        self._claim_policy.resources_seen = True

    async def close(self) -> None:
        """Answer every parked call, then close the store (SQLite: the readers, then the
        writer drains and folds the WAL back). Idempotent."""
        try:
            await self.push.close()
            await self.beats.close()
        finally:
            await self.store.close()

    # ------------------------------------------------------------ workers

    async def heartbeat(self, p: Heartbeat) -> HeartbeatResult:
        """Record a worker's roles and readings (stamped with the store's clock).

        Returns the ids of jobs this worker holds whose cancel was requested, and each
        held job's governance action. A new `incarnation` first ends the leases of the
        worker's predecessor (`worker_lost`). A gate reading that is NaN or infinite is
        stored as unknown. Raises: errors.BadRequest (empty id, bad readings types, bad
        kinds, GPU devices coordd.rules.resources.check_readings refuses), PayloadTooLarge.
        """
        return await self.beats.heartbeat(p)  # coordd.service.beats: full or quiet

    async def renew(self, p: Renew) -> RenewResult:
        """Extend a lease; `action` is the job's governance action. Raises: LeaseLost,
        LeaseExpired, AlreadyCompleted, NotFound."""
        res, changes = await self.store.renew_governed(lease_ref(p), self._lease_s(p.lease_s),
                                                       self.governance)
        self.meters.count_governance(p.worker_id, changes)
        return res  # type: ignore[no-any-return]

    async def checkpoint(self, p: Checkpoint) -> dict[str, Any]:
        """Record a job's latest checkpoint. Raises: PayloadTooLarge and the lease errors."""
        text = values.encode("checkpoint", p.checkpoint, self.config.max_checkpoint_bytes)
        await self.store.checkpoint(lease_ref(p), text)
        return {}

    async def complete(self, p: Complete) -> CompleteResult:
        """Store a job's result, once; reported `usage` counts against the budgets of its
        limits in the same transaction; a result `artifact` is recorded as the store holds
        it (Transfers.held); with `next`, then claim the worker's next job
        (coordd.service.dispatch). Raises: AlreadyCompleted (a result is stored: treat as
        success), LeaseLost, LeaseExpired, PayloadTooLarge, NotFound, BadRequest (bad
        usage, a bad `next`, an artifact the store does not hold with that size: upload it
        first): nothing is claimed then."""
        text = values.encode("result", p.result, self.config.max_result_bytes)
        usage = self.check_usage(p.usage)
        nxt = self.next_claim(p)
        art = None if p.artifact is None else await self.transfers.held(p.artifact)
        if usage:
            res: CompleteResult = await self.store.complete_counted(
                lease_ref(p), text, usage, self.limit_book, self._backoff(),
                artifact=art, then=nxt)
        else:
            res = await self.store.complete(lease_ref(p), text, artifact=art, then=nxt)
        return await self._then(res, nxt)

    async def fail(self, p: Fail) -> StatusResult:
        """Record a failure; the error text is truncated to `max_error_chars`; `next` as
        `complete`'s.

        Retryable with attempts left -> waiting after exponential backoff with jitter;
        otherwise `failed` (dead letter). Raises: the lease errors.
        """
        error = truncate(p.error, self.config.max_error_chars)
        nxt = self.next_claim(p)
        res = await self.store.fail(lease_ref(p), error, p.retryable, self._backoff(),
                                    then=nxt)
        return await self._then(res, nxt)  # type: ignore[no-any-return]

    async def release(self, p: Release) -> StatusResult:
        """Hand a held job back without spending an attempt; `next` as `complete`'s.
        Raises: the lease errors, BadRequest, PayloadTooLarge (checkpoint)."""
        reason = _clip(p.reason or "released", self.config.max_error_chars)
        ckpt = None if p.checkpoint is None else values.encode(
            "checkpoint", p.checkpoint, self.config.max_checkpoint_bytes)
        nxt = self.next_claim(p)
        res = await self.store.release(lease_ref(p), reason, ckpt, then=nxt)
        logger.info("job %s released by %s: %s", p.job_id, p.worker_id, reason,
                    extra={"action": "release", "job_id": p.job_id, "worker_id": p.worker_id})
        return await self._then(res, nxt)  # type: ignore[no-any-return]

    async def _then(self, res: Any, nxt: Any) -> Any:
        """A report's reply with its next claim: run in the same write (counted here), or
        now, apart, where the store left `next` None (it could not)."""
        res.next = self.counted(res.next) if res.next is not None \
            else await self.claim_next(nxt)
        return res

    async def goodbye(self, p: Goodbye) -> ReleasedResult:
        """Mark the worker offline now; leases it still holds end (`worker_lost`).
        Raises: NotFound (never sent a heartbeat), BadRequest."""
        check_name("worker_id", p.worker_id)
        lost = await self.store.goodbye(p.worker_id, p.incarnation)
        logger.info("worker %s said goodbye", p.worker_id,
                    extra={"action": "worker_goodbye", "worker_id": p.worker_id})
        log_lost(p.worker_id, lost, "stopped")
        return ReleasedResult(released=lost)

    async def forget_worker(self, p: ForgetWorker) -> ReleasedResult:
        """Drop a dead worker (admin). Raises: NotFound, InvalidState (live or holding
        leases without `force`)."""
        check_name("worker_id", p.worker_id)
        lost = await self.store.forget_worker(p.worker_id, self.config.heartbeat_stale_s,
                                              p.force)
        logger.info("worker %s forgotten", p.worker_id,
                    extra={"action": "worker_forget", "worker_id": p.worker_id})
        log_lost(p.worker_id, lost, "forgotten")
        return ReleasedResult(released=lost)

    def new_job_id(self) -> str:
        """A fresh, time-ordered job id (coordd.ids): FIFO among jobs queued together."""
        return self._ids.new(self.clock.wall())

    def _backoff(self) -> Any:
        return partial(backoff_delay, base_s=self.config.backoff_base_s,
                       cap_s=self.config.backoff_cap_s, jitter=self.config.backoff_jitter,
                       u=self._rng.random())

    # ------------------------------------------------------------ producers and admin

    def check_gates(self, priority: int, overrides: dict[str, Any]) -> None:
        """Raise BadRequest unless `overrides` are valid gate keys for `priority`."""
        try:
            gates.merge(self._policies[priority], overrides)
        except msgspec.ValidationError as exc:
            raise errors.BadRequest(f"gates: {exc}") from exc
        idle = overrides.get("min_user_idle_s")
        if isinstance(idle, (int, float)):
            check_duration("gates.min_user_idle_s", idle, zero=True)

    async def enqueue(self, p: Enqueue) -> EnqueueResult:
        """Add a waiting job; a repeated idempotency key with the same request returns the
        existing job id with created=False (the insert and the id come from one transaction).

        Raises: BadRequest (priority outside 0..3, empty names, bad gates, a time or
        duration out of range, a non-finite number; what the store cannot store),
        PayloadTooLarge (payload JSON over `max_payload_bytes`; nothing is written),
        InvalidState (the key was used by another request).
        """
        return (await self._enqueue([intake.new_job(self, p)], indexed=False))[0]

    async def enqueue_batch(self, p: EnqueueBatch) -> EnqueueBatchResult:
        """Add many jobs in one transaction, all or none. Raises as `enqueue`, the message
        starting with the job's index in the batch (`jobs[3]: ...`)."""
        jobs: list[NewJob] = []
        try:
            for j in p.jobs:
                jobs.append(intake.new_job(self, j))
        except errors.CoordError as exc:
            raise errors.batch_item(len(jobs), exc) from exc
        return EnqueueBatchResult(jobs=await self._enqueue(jobs, indexed=True))

    async def _enqueue(self, jobs: list[NewJob], indexed: bool) -> list[EnqueueResult]:
        try:
            return await self.store.enqueue(jobs,  # type: ignore[no-any-return]
                                            indexed=indexed)
        except errors.InvalidState as exc:  # an idempotency key taken by another request
            logger.info("enqueue refused: %s", exc.message,
                        extra={"action": "idempotency_conflict"})
            raise

    async def cancel(self, p: JobId) -> StatusResult:
        """Cancel a job; a workflow node's dependents follow their policies in the same
        transaction. Raises: NotFound, InvalidState, BadRequest."""
        check_id("job_id", p.job_id)
        return await self.store.cancel(p.job_id)  # type: ignore[no-any-return]

    async def retry(self, p: JobId) -> StatusResult:
        """Put a failed, cancelled or skipped job back to waiting (a workflow node reopens
        its workflow). Raises: NotFound, InvalidState, BadRequest."""
        check_id("job_id", p.job_id)
        return await self.store.retry(p.job_id)  # type: ignore[no-any-return]

    async def ping(self) -> None:
        """Run an empty write through the store: the watchdog's proof of a live store.
        Raises: errors.Overloaded, errors.Unavailable, errors.CoordError."""
        await self.store.ping()

    async def reap(self, p: Empty | None = None) -> ReapResult:
        """Reap expired leases now (the store's clock decides). Returns how many."""
        n = await self.store.reap(limit=REAP_LIMIT)
        if n:
            self.meters.lease_expiries.inc(n)
            logger.info("reaped %d expired lease(s)", n, extra={"action": "reap", "n": n})
        return ReapResult(reaped=n)

    # ---------------------------------------------------------- maintenance (service.reaper)

    async def workflow_tick(self) -> tuple[int, int, int]:
        """The maintenance round's workflow step (`Workflows.tick`): absent workers' nodes
        skipped, running workflows settled, due schedule slots started."""
        return await self.flows.tick()

    async def upkeep(self) -> PruneResult:
        """The prune round (coordd.service.maintenance.Maintenance.prune)."""
        return await self.maintenance.prune()

    async def backup(self, p: Backup) -> BackupResult:
        """A verified backup at `p.dest` (the store's `backup`; SQLite:
        coordd.store.sqlite.backup, the database copied while writes go on, the artifact files
        and a manifest). Raises: BadRequest (dest exists or its folder is missing), CoordError
        (the copy failed its check: it is removed); on PostgreSQL InvalidState, naming
        pg_dump."""
        return await self.store.backup(p.dest)  # type: ignore[no-any-return]

    def _lease_s(self, asked: float | None, what: str = "lease_s") -> float:
        if asked is None:
            return self.config.lease_default_s
        check_duration(what, asked)  # then clamped to lease_min_s..lease_max_s
        return min(self.config.lease_max_s, max(self.config.lease_min_s, float(asked)))
