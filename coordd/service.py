"""The coordinator's operations: validate, then write through the Writer or read beside it.

`Coordinator` has one coroutine per RPC method (DESIGN.md, "Wire protocol"); each takes
the method's params Struct from coordd.protocol and returns its result Struct, raising a
`coordd.errors.CoordError` whose `code` goes on the wire. Nothing slow runs inside the
writer's transaction: sizes and encodings are checked here, before the op is queued.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sqlite3
from functools import partial
from typing import Any

import msgspec

from coordd import (
    backup, budgets, enrol, errors, fdlimit, gates, governor, intake, leases, store, transfers,
    values, views, waits, web_reads, worker_list,
)
from coordd import explain, waiting_report
from coordd.maintenance import Maintenance, file_size
from coordd.hub import Hub
from coordd.store.sqlite_hub import SQLiteHub
from coordd.store.sqlite_logs import SQLiteLogs
from coordd.store.sqlite_enrol import SQLiteEnrol
from coordd.lifecycle import LIFECYCLE_METHODS, Lifecycle
from coordd.limit_service import FleetLimits
from coordd.protocol_limits import LimitsQuery
from coordd.logs import JobLogStore
from coordd.ids import JobIds
from coordd.clock import Clock, anchored
from coordd.config import Config, artifact_dir_for
from coordd.protocol import (
    Backup, BackupResult, Checkpoint, Claim, ClaimResult, Complete,
    CompleteResult, Empty, Enqueue, EnqueueBatch, EnqueueBatchResult, EnqueueResult, Fail,
    GetJob, Heartbeat, HeartbeatResult, JobId, JobList, JobView, ListJobs, MetricsResult,
    Readings, ReapResult,
    Renew, RenewResult, StatusReply, StatusResult, WorkersResult, JOB_STATUSES,
    HUB_PARAMS,
)
from coordd.protocol_logs import LOG_PARAMS
from coordd.protocol_workflows import (
    ListWorkflows, ScheduleAdd, ScheduleList, ScheduleName, ScheduleView, WorkflowId,
    WorkflowList, WorkflowSubmit, WorkflowSubmitResult, WorkflowView,
)
from coordd.metrics import Metrics, tree_bytes
from coordd.readers import Coalesced, ReadPool
from coordd.names import check_name
from coordd.store import workers as wkstore
from coordd import resources
from coordd.store import limits as limit_store
from coordd.store import resources as resstore
from coordd.times import check_duration
from coordd.store import workflows as wstore
from coordd.workflows import Workflows
from coordd.writer import Writer

logger = logging.getLogger(__name__)

LIST_LIMIT_MAX = 1000


class Coordinator:
    """The operations over one database.

    Args:
        db_path: the SQLite file.
        config: limits, defaults and gate policies.
        clock: the injectable clock (tests pin it).
        rng: source of backoff jitter (tests may seed it).
    """

    def __init__(self, db_path: str, config: Config, clock: Clock,
                 rng: random.Random | None = None) -> None:
        self.db_path = db_path
        self.artifact_dir = artifact_dir_for(db_path)
        self.artifact_bytes = 0  # the artifact store's size at the last prune or scrape
        self.config = config
        self.clock = anchored(clock)  # steps of the wall clock are taken by the writer
        self._rng = rng or random.Random()
        self._ids = JobIds()
        self.meters = Metrics()
        self.writer = Writer(db_path, self.clock, queue_max=config.writer_queue_max,
                             batch_max=config.writer_batch_max,
                             busy_timeout_ms=config.busy_timeout_ms,
                             clock_jump_s=config.clock_jump_s,
                             clock_step_s=config.clock_step_s, metrics=self.meters,
                             wal_size_limit=config.wal_size_limit_bytes,
                             wal_autocheckpoint_pages=config.wal_autocheckpoint_pages,
                             checkpoint_interval_s=config.wal_checkpoint_interval_s)
        self.readers = ReadPool(db_path, config.read_connections, config.read_queue_max,
                                config.busy_timeout_ms)
        self._policies = config.policies()
        self.limit_book = config.limit_book()  # fleet-wide limits (coordd.limits)
        self._claim_policy = leases.ClaimPolicy(
            policies=self._policies, heartbeat_stale_s=config.heartbeat_stale_s,
            aging_interval_s=config.aging_interval_s, limits=self.limit_book,
            role_kinds=self.writer.changes.role_kinds)
        self.governor = governor.Governor(config, self._policies, self.meters, self._read)
        hint = self.governor.reservations  # may a reservation exist? (coordd.preemption)
        self._claim_policy.reservations = self.writer.changes.reservations = hint
        self.flows = Workflows(self)
        self._status = Coalesced(self._status_now)  # many pollers share one read
        self.maintenance = Maintenance(self)
        self.prune = self.maintenance.prune  # the `prune` method (coordd.maintenance)
        self.hub = Hub(SQLiteHub(self.writer, self.readers, self.clock), config)
        for method in HUB_PARAMS:  # the hub's RPC methods are served by coordd.hub
            setattr(self, method, getattr(self.hub, method))
        self.lifecycle = Lifecycle(self.writer, self._read, config, clock)
        for method in LIFECYCLE_METHODS:  # release, goodbye, forget_worker
            setattr(self, method, getattr(self.lifecycle, method))
        self.logs = JobLogStore(SQLiteLogs(self.writer, self.readers))
        for method in LOG_PARAMS:  # a job's captured output: coordd.logs
            setattr(self, method, getattr(self.logs, method))
        for part in (enrol.Enrolment(SQLiteEnrol(self.writer, self.readers, self.clock),
                                     config),  # issue 18
                     transfers.Transfers(self.artifact_dir, self._read, self.clock, config)):
            for method in part.METHODS:  # token_create, ca_bundle, enroll, artifact_put/get
                setattr(self, method, getattr(part, method))
        waits.Waits.serve(self)  # self.push: claim wait_s, wait_job, watch_* (coordd.push)
        web_reads.WebReads.serve(self)  # find_jobs, job_stats, fleet, ... (the web view)
        FleetLimits.serve(self)  # self.fleet_limits: limits, limits_set, limits_reset

    async def start(self) -> None:
        """Open the writer (creating and migrating the DB) and the read-only connections.

        Raises:
            errors.StoreError: the file is not a compatible coordd database.
        """
        try:
            await self.writer.start()
        except sqlite3.Error as exc:
            raise errors.StoreError(f"{self.db_path}: {exc}") from exc
        try:
            await self.readers.start()
            await self.fleet_limits.load()  # runtime overrides kept in the database
            # the limits release trigger is dropped while no limit is defined nor unit held
            await self.writer.run(partial(limit_store.settle_release_trigger,
                                          active=self.limit_book.active), urgent=True)
        except sqlite3.Error as exc:
            await self.close()
            raise errors.StoreError(f"{self.db_path}: {exc}") from exc
        except BaseException:
            await self.close()
            raise
        if await self._read(resstore.any_request):
            self.resources_seen()

    def resources_seen(self) -> None:
        """A job asked for resources: claims check requests from now on (coordd.admission)."""
        self._claim_policy.resources_seen = True

    async def close(self) -> None:
        """Close the readers, then drain and close the writer (whose close folds the WAL
        back into the main file, so the .db alone is complete after a clean stop). Idempotent."""
        try:
            await self.push.close()  # every parked call answers, before the readers go
            await self.readers.close()
        finally:
            await self.writer.stop()

    async def read(self, fn: Any, *args: Any) -> Any:
        """Run `fn(conn, *args)` on a read-only connection (coordd.readers).

        Raises: errors.Overloaded (the read queue is full).
        """
        return await self.readers.run(fn, *args)

    async def _read(self, fn: Any, *args: Any) -> Any:
        return await self.readers.run(fn, *args)

    async def _read_heavy(self, fn: Any, *args: Any) -> Any:
        """A read that may take long: never on the last free read connection."""
        return await self.readers.run(fn, *args, heavy=True)

    # ------------------------------------------------------------ workers

    async def heartbeat(self, p: Heartbeat) -> HeartbeatResult:
        """Record a worker's roles and readings (stamped with coordd's clock).

        Returns the ids of jobs this worker holds whose cancel was requested. A new
        `incarnation` first ends the leases of the worker's predecessor (`worker_lost`).
        A gate reading that is NaN or infinite is stored as unknown, with its reason.
        Raises: errors.BadRequest (empty id, bad readings types, bad kinds, a non-finite
        extra reading, GPU devices coordd.resources.check_readings refuses).
        """
        _, readings_json = checked_readings(p, self.config.max_payload_bytes)
        roles_json = store.dumps(sorted(set(p.roles)))
        kinds_json, broken_json = self.lifecycle.heartbeat_state(p)

        def op(conn: sqlite3.Connection, now: float) -> Any:
            lost = wkstore.release_predecessor(conn, now, p.worker_id, p.incarnation)
            cancel = store.heartbeat(conn, now, p.worker_id, roles_json, readings_json)
            wkstore.store_state(conn, p.worker_id, p.incarnation, kinds_json, broken_json)
            return cancel, lost, now, self.governor.on_heartbeat(conn, now, p.worker_id)
        cancel, lost, now, gov = await self.writer.run(op, urgent=True)
        self.lifecycle.log_lost(p.worker_id, lost, "restarted (new incarnation)")
        self.governor.count(p.worker_id, gov)  # suspend/resume/vacate: coordd.governance
        return HeartbeatResult(now=now, cancel=cancel, artifact_dir=self.artifact_dir,
                               lost=lost, actions=gov.actions)

    async def claim(self, p: Claim) -> ClaimResult:
        """Claim the best job for `p.worker_id` (see coordd.leases.claim).

        `lease_s` is clamped to the configured [lease_min_s, lease_max_s]; it never
        depends on a job's max runtime. Raises: errors.BadRequest.
        """
        check_name("worker_id", p.worker_id)
        if p.claim_id is not None:
            check_name("claim_id", p.claim_id)
        lease_s = self._lease_s(p.lease_s)
        result = await self.writer.run(
            partial(leases.claim, worker_id=p.worker_id, lease_s=lease_s, claim_id=p.claim_id,
                    policy=self._claim_policy,
                    kinds_json=None if p.kinds is None else store.dumps(p.kinds)))
        if result.job is not None:
            self.meters.claims.inc()
        for reason in result.reasons:
            self.meters.refusals.labels(reason).inc()
        return result

    async def renew(self, p: Renew) -> RenewResult:
        """Extend a lease. Raises: LeaseLost, LeaseExpired, AlreadyCompleted, NotFound."""
        return await self.governor.renew(self.writer, p, self._lease_s(p.lease_s))

    async def checkpoint(self, p: Checkpoint) -> dict[str, Any]:
        """Record a job's latest checkpoint. Raises: PayloadTooLarge and the lease errors."""
        text = values.encode("checkpoint", p.checkpoint, self.config.max_checkpoint_bytes)
        await self.writer.run(
            lambda conn, now: leases.checkpoint(conn, now, p.job_id, p.worker_id, p.token, text),
            urgent=True)
        return {}

    async def complete(self, p: Complete) -> CompleteResult:
        """Store a job's result, once. Raises: AlreadyCompleted (a result is stored: treat as
        success), LeaseLost, LeaseExpired, PayloadTooLarge, NotFound."""
        text = values.encode("result", p.result, self.config.max_result_bytes)
        backoff = self._backoff()
        return await self.writer.run(self.fleet_limits.counting(  # usage against budgets
            p.job_id, p.usage, lambda conn, now: leases.complete(
                conn, now, p.job_id, p.worker_id, p.token, text, p.artifact, backoff)),
            urgent=True)

    async def fail(self, p: Fail) -> StatusResult:
        """Record a failure; the error text is truncated to `max_error_chars`.

        Retryable with attempts left -> waiting after exponential backoff with jitter;
        otherwise `failed` (dead letter). Raises: the lease errors.
        """
        error = _truncate(p.error, self.config.max_error_chars)
        backoff = self._backoff()
        return await self.writer.run(
            lambda conn, now: leases.fail(conn, now, p.job_id, p.worker_id, p.token, error,
                                         p.retryable, backoff), urgent=True)

    def new_job_id(self) -> str:
        """A fresh, time-ordered job id (coordd.ids): FIFO among jobs queued together."""
        return self._ids.new(self.clock.wall())

    def _backoff(self) -> Any:
        return partial(leases.backoff_delay, base_s=self.config.backoff_base_s,
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

    def _new_job(self, p: Enqueue) -> store.NewJob:
        return intake.new_job(self, p)

    async def enqueue(self, p: Enqueue) -> EnqueueResult:
        """Add a waiting job; a repeated idempotency key with the same request returns the
        existing job id with created=False (the insert and the id come from one transaction).

        Raises: BadRequest (priority outside 0..3, empty names, bad gates, a time or
        duration out of range, a non-finite number), PayloadTooLarge (payload JSON over
        `max_payload_bytes`; nothing is written), InvalidState (the key was used by
        another request).
        """
        job = self._new_job(p)
        return await self._write_jobs(lambda conn, now: store.enqueue(conn, now, job))

    async def enqueue_batch(self, p: EnqueueBatch) -> EnqueueBatchResult:
        """Add many jobs in one transaction, all or none. Raises as `enqueue`, the message
        starting with the job's index in the batch (`jobs[3]: ...`)."""
        jobs: list[store.NewJob] = []
        try:
            for j in p.jobs:
                jobs.append(self._new_job(j))
        except errors.CoordError as exc:
            raise intake.batch_item(len(jobs), exc) from exc

        def op(conn: sqlite3.Connection, now: float) -> list[EnqueueResult]:
            out: list[EnqueueResult] = []
            try:
                for j in jobs:
                    out.append(store.enqueue(conn, now, j))
            except errors.CoordError as exc:
                raise intake.batch_item(len(out), exc) from exc
            return out
        return EnqueueBatchResult(jobs=await self._write_jobs(op))

    async def _write_jobs(self, op: Any) -> Any:
        try:
            return await self.writer.run(op)
        except errors.InvalidState as exc:  # an idempotency key taken by another request
            logger.info("enqueue refused: %s", exc.message,
                        extra={"action": "idempotency_conflict"})
            raise

    async def cancel(self, p: JobId) -> StatusResult:
        """Cancel a job (see coordd.store.cancel); a workflow node's dependents follow their
        policies in the same transaction. Raises: NotFound, InvalidState."""
        return await self.writer.run(lambda conn, now: wstore.cancel_job(conn, now, p.job_id))

    async def retry(self, p: JobId) -> StatusResult:
        """Put a failed, cancelled or skipped job back to waiting (a workflow node reopens
        its workflow). Raises: NotFound, InvalidState."""
        return await self.writer.run(lambda conn, now: wstore.retry_job(conn, now, p.job_id))

    async def ping(self) -> None:
        """Run an empty request through the writer (BEGIN IMMEDIATE ... COMMIT).

        Returns once the writer has committed it: the watchdog's proof of a live writer.
        Raises: errors.Overloaded (queue full or shutting down), errors.CoordError.
        """
        await self.writer.run(lambda conn, now: None, urgent=True)

    async def reap(self, p: Empty | None = None) -> ReapResult:
        """Reap expired leases now (coordd's clock decides). Returns how many."""
        n = await self.writer.run(lambda conn, now: store.reap_expired(conn, now))
        if n:
            self.meters.lease_expiries.inc(n)
            logger.info("reaped %d expired lease(s)", n, extra={"action": "reap", "n": n})
        return ReapResult(reaped=n)

    async def metrics(self, p: Empty | None = None) -> MetricsResult:
        """Refresh the gauges (a `status` read, the writer's queue, the artifact store's
        size) and return every series in Prometheus text format."""
        st = await self.status()
        self.artifact_bytes = await asyncio.to_thread(tree_bytes, self.artifact_dir)
        self.meters.set_status(st, self.writer.queue_depth, self.artifact_bytes)
        self.meters.set_limits((await self.limits(LimitsQuery(holders=False))).limits)
        return MetricsResult(text=self.meters.render())

    # ------------------------------------------------------------ reads

    async def status(self, p: Empty | None = None) -> StatusReply:
        """Counts of workers, live leases and jobs by status (every status, zero where none).

        Callers that ask while a status read runs share the next one (coordd.readers.
        Coalesced): still read after they asked, at a fraction of the reads.
        Raises: errors.Overloaded (the read queue is full).
        """
        return await self._status()

    async def _status_now(self) -> StatusReply:
        now = self.clock.wall()
        jobs, waiting = views.counts_view(self.writer.changes.counts)  # committed counts
        workers, live, leases, oldest, prunable = await self._read(
            views.status_live, now, self.config.heartbeat_stale_s, now - self.config.retention_s)
        db_bytes, wal_bytes = file_size(self.db_path), file_size(self.db_path + "-wal")
        warnings = []
        if db_bytes > self.config.warn_db_bytes:
            warnings.append(f"database is {db_bytes} bytes (> warn_db_bytes "
                            f"{self.config.warn_db_bytes}); "
                            f"{'at least ' if prunable >= views.PRUNABLE_COUNTED_MAX else ''}"
                            f"{prunable} job(s) can be pruned")
        if self.artifact_bytes > self.config.warn_artifact_bytes:
            warnings.append(f"artifact store is {self.artifact_bytes} bytes (> "
                            f"warn_artifact_bytes {self.config.warn_artifact_bytes})")
        if wal_bytes > self.config.warn_wal_bytes:
            warnings.append(f"WAL is {wal_bytes} bytes (> warn_wal_bytes "
                            f"{self.config.warn_wal_bytes}): is a long read pinning it?")
        warnings += [w for w in (self.writer.health.warning(), fdlimit.warning()) if w]
        heads, late = await waiting_report.waiting(  # the oldest waiting, a late P0
            self._read, self.explain_waiting, now, waiting, self.config.aging_interval_s,
            self.config.warn_p0_wait_s)
        return StatusReply(workers=workers, workers_live=live, active_leases=leases, jobs=jobs,
                           waiting_by_priority=waiting, db_bytes=db_bytes, wal_bytes=wal_bytes,
                           oldest_waiting_age_s=oldest, now=now, prunable=prunable,
                           warnings=warnings + late, waiting=heads)

    async def get_job(self, p: GetJob | JobId) -> JobView:
        """One job with lease, events and, if waiting, why it is not running; with
        `p.prefix`, the one job whose id starts with `p.job_id`.

        Raises: NotFound, BadRequest (an ambiguous prefix: a few matches are named).
        """
        now = self.clock.wall()
        prefix = getattr(p, "prefix", False)  # a plain JobId (in-process callers): exact
        job_id = await self._read(views.resolve_job_id, p.job_id) if prefix else p.job_id
        if budgets.reply_budgeted():  # a large reply's bytes are reserved before they are read
            await budgets.reserve_reply(await self._read(views.job_bytes, job_id))
        job = await self._read(views.get_job, now, job_id, self.config.aging_interval_s)
        job.workflow_id, job.node, job.result_schema, deps = await self._read(
            wstore.node_info, job_id)
        job.preemptions = await self._read(wkstore.preemptions, job_id)
        if job.status == "waiting":
            job.waiting_reason = await self._explain(job, now)
        elif job.status == "blocked":
            job.waiting_reason = "blocked: waits for " + ", ".join(
                f"{name} ({status})" for name, status, _ in deps if status in
                ("blocked", "waiting", "running"))
        await self.governor.annotate(job, now)  # suspended since, reserved for
        await self.fleet_limits.annotate(job, now)  # its limits; a full one, first
        return job

    async def list_jobs(self, p: ListJobs) -> JobList:
        """A page of jobs (filters: status, kind, role, priority). Raises: BadRequest."""
        if p.status is not None and p.status not in JOB_STATUSES:
            raise errors.BadRequest(f"status must be one of {', '.join(JOB_STATUSES)}")
        limit = max(1, min(p.limit, LIST_LIMIT_MAX))
        now = self.clock.wall()
        page = {"status": p.status, "kind": p.kind, "role": p.role, "priority": p.priority,
                "limit": limit, "after": p.after, "newest_first": p.newest_first}
        if budgets.reply_budgeted():  # a large page's bytes are reserved before it is read
            await budgets.reserve_reply(await self._read_heavy(partial(views.page_bytes,
                                                                       **page)))
        jobs = await self._read_heavy(partial(
            views.list_jobs, now=now, aging_s=self.config.aging_interval_s, **page))
        await self.explain_waiting(jobs, now)
        return JobList(jobs=jobs, next_after=jobs[-1].job_id if len(jobs) == limit else None)

    async def explain_waiting(self, jobs: list[JobView], now: float) -> None:
        """Put why each waiting job of `jobs` is not running at `now` into its
        `waiting_reason` (`list`, and the web view's job lists)."""
        if not any(j.status == "waiting" for j in jobs):
            return
        workers = await self._read(views.list_workers)
        states = await self.lifecycle.states()
        for j in jobs:
            if j.status == "waiting":
                j.waiting_reason = self._explain_with(j, now, workers, states)
        await self.governor.explain_resources(jobs, workers, states, now)  # vram: need ...
        await self.fleet_limits.explain(jobs, now)

    async def workers(self, p: Empty | None = None) -> WorkersResult:
        """Every known worker with its readings, heartbeat age and per-priority gate verdicts."""
        now = self.clock.wall()
        states, gov = await self.lifecycle.states(), await self.governor.worker_notes()
        grants, reserved = await self.governor.resource_books()
        out = worker_list.worker_views(await self._read(views.list_workers), now,
                                       self.config.heartbeat_stale_s, self._policies, states,
                                       gov, grants, reserved)
        return WorkersResult(workers=out)

    async def check(self, p: Empty | None = None) -> dict[str, Any]:
        """Run `PRAGMA quick_check` and `foreign_key_check` on the live database."""
        qc, fk = await self._read_heavy(views.integrity)
        return {"quick_check": qc, "foreign_key_violations": len(fk)}

    async def backup(self, p: Backup) -> BackupResult:
        """Write a verified backup at `p.dest`: the database copied with SQLite's backup API
        while writes go on, the artifact files it refers to, and a manifest of their
        sha256 (coordd.backup). Runs in a thread, beside the writer.

        Raises: BadRequest (dest exists or its folder is missing), CoordError (the copy
        failed its check: it is removed).
        """
        return await asyncio.to_thread(backup.backup, self.db_path, self.artifact_dir, p.dest)

    # ------------------------------------------------------------ workflows (coordd.workflows)

    async def workflow_submit(self, p: WorkflowSubmit) -> WorkflowSubmitResult:
        return await self.flows.submit(p)

    async def workflow_get(self, p: WorkflowId) -> WorkflowView:
        """The workflow (coordd.workflows); a waiting node's `reason` says why it is not
        running, as `show` does for a job."""
        wf = await self.flows.get(p)
        waiting = [n for n in wf.nodes if n.status == "waiting"]
        if waiting:
            now = self.clock.wall()
            workers, states = await self._read(views.list_workers), await self.lifecycle.states()
            jobs = [await self._read(views.get_job, now, n.job_id, self.config.aging_interval_s)
                    for n in waiting]
            for job in jobs:
                job.waiting_reason = self._explain_with(job, now, workers, states)
            await self.fleet_limits.explain(jobs, now)  # a full limit, first
            for n, job in zip(waiting, jobs):
                n.reason = job.waiting_reason
        return wf

    async def workflow_list(self, p: ListWorkflows) -> WorkflowList:
        return await self.flows.list(p)

    async def workflow_cancel(self, p: WorkflowId) -> WorkflowView:
        return await self.flows.cancel(p)

    async def schedule_add(self, p: ScheduleAdd) -> ScheduleView:
        return await self.flows.schedule_add(p)

    async def schedule_list(self, p: Any = None) -> ScheduleList:
        return await self.flows.schedule_list(p)

    async def schedule_remove(self, p: ScheduleName) -> dict[str, Any]:
        return await self.flows.schedule_remove(p)

    # ------------------------------------------------------------ helpers

    def _lease_s(self, asked: float | None) -> float:
        if asked is None:
            return self.config.lease_default_s
        check_duration("lease_s", asked)  # then clamped to lease_min_s..lease_max_s
        return min(self.config.lease_max_s, max(self.config.lease_min_s, float(asked)))

    async def _explain(self, job: JobView, now: float) -> str:
        return self._explain_with(job, now, await self._read(views.list_workers),
                                  await self.lifecycle.states())

    def _explain_with(self, job: JobView, now: float, workers: list[Any],
                      states: dict[str, wkstore.WorkerState]) -> str:
        return explain.why_waiting(job, now, workers, states, self._policies,
                                   self.config.heartbeat_stale_s)


def checked_readings(p: Heartbeat, max_bytes: int) -> tuple[dict[str, Any], str]:
    """Check a heartbeat's worker id, roles and readings; return the readings to store (a
    NaN or infinite gate reading made unknown) and their JSON.

    Raises: errors.BadRequest (a bad name, readings types or GPU devices),
    errors.PayloadTooLarge (the readings' JSON is over `max_bytes`).
    """
    check_name("worker_id", p.worker_id)
    for role in p.roles:
        check_name("role", role)
    try:
        msgspec.convert(p.readings, Readings)
    except msgspec.ValidationError as exc:
        raise errors.BadRequest(f"readings: {exc}") from exc
    resources.check_readings(p.readings)  # GPU devices: bounded, unique, in range
    readings = values.unknown_if_not_finite(p.readings)  # a NaN gate reading: unknown
    return readings, values.encode("readings", readings, max_bytes)


def _truncate(text: str, limit: int) -> str:
    """Cut `text` to `limit` characters and make it storable: what UTF-8 cannot encode
    (lone surrogates) is escaped, so recording a failure cannot itself fail."""
    if len(text) > limit:
        text = text[:limit] + f"... [truncated {len(text) - limit} chars]"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
