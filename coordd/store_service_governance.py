"""Governance of running work and workers over the store interface (coordd.store.
api_governance): `heartbeat` and `renew` with their actions, `goodbye`,
`forget_worker`, `workers`, `metrics`, for StoreCoordinator (coordd.store_service).

Same params, checks, replies and log lines as the SQLite Coordinator's (coordd.service,
coordd.governor, coordd.lifecycle): the checks are those functions, called as they are.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import msgspec

from coordd import governor
from coordd.lifecycle import Lifecycle
from coordd.metrics import Metrics
from coordd.names import check_name
from coordd.protocol import (
    Empty, Heartbeat, HeartbeatResult, JobView, MetricsResult, Renew, RenewResult,
    WorkersResult,
)
from coordd.protocol_workers import ForgetWorker, Goodbye, ReleasedResult
from coordd.service import checked_readings
from coordd.store.api import LeaseRef
from coordd.store.api_governance import Governance, WorkerBeat
from coordd.worker_list import worker_views

logger = logging.getLogger(__name__)

METHODS = ("goodbye", "forget_worker", "workers", "metrics")
"""The RPC methods this mixin adds to StoreCoordinator (`heartbeat`, `renew` are core)."""


class GovernanceService:
    """Mixed into StoreCoordinator (its `store`, `config`, `_policies`, `_lease_s`,
    `status`)."""

    store: Any
    config: Any
    _policies: Any
    _lease_s: Any
    status: Any

    # the SQLite side's checks and log lines, shared as they are (they use no state)
    _heartbeat_state = Lifecycle.heartbeat_state
    _log_lost = Lifecycle.log_lost

    @functools.cached_property
    def governance(self) -> Governance:
        """Gate policies and the preemption pacer (coordd.governor.preemptor)."""
        return Governance(policies=self._policies, preemptor=governor.preemptor(self.config))

    @functools.cached_property
    def meters(self) -> Metrics:
        """This coordd's metrics (governance and preemption counts; `metrics`)."""
        return Metrics()

    async def heartbeat(self, p: Heartbeat) -> HeartbeatResult:
        """Record a worker's roles and readings (the database's clock stamps them), end a
        predecessor incarnation's leases, preempt, and return each held job's action.
        Raises: as the SQLite Coordinator's heartbeat."""
        readings, _ = checked_readings(p, self.config.max_payload_bytes)
        kinds_json, broken_json = self._heartbeat_state(p)
        beat = WorkerBeat(incarnation=p.incarnation, kinds_json=kinds_json,
                          broken_json=broken_json)
        got = await self.store.heartbeat_governed(p.worker_id, p.roles, readings, beat,
                                                  self.governance)
        self._log_lost(p.worker_id, got.result.lost, "restarted (new incarnation)")
        self.meters.count_governance(p.worker_id, got.changes, got.preempted)
        return got.result

    async def renew(self, p: Renew) -> RenewResult:
        """Extend a lease; `action` is the job's governance action. Raises: LeaseLost,
        LeaseExpired, AlreadyCompleted, NotFound."""
        ref = LeaseRef(job_id=p.job_id, worker_id=p.worker_id, token=p.token)
        res, changes = await self.store.renew_governed(ref, self._lease_s(p.lease_s),
                                                       self.governance)
        self.meters.count_governance(p.worker_id, changes)
        return res

    async def goodbye(self, p: Goodbye) -> ReleasedResult:
        """Mark the worker offline now; leases it still holds end (`worker_lost`).
        Raises: NotFound (never sent a heartbeat), BadRequest."""
        check_name("worker_id", p.worker_id)
        lost = await self.store.goodbye(p.worker_id, p.incarnation)
        logger.info("worker %s said goodbye", p.worker_id,
                    extra={"action": "worker_goodbye", "worker_id": p.worker_id})
        self._log_lost(p.worker_id, lost, "stopped")
        return ReleasedResult(released=lost)

    async def forget_worker(self, p: ForgetWorker) -> ReleasedResult:
        """Drop a dead worker (admin). Raises: NotFound, InvalidState (live or holding
        leases without `force`)."""
        check_name("worker_id", p.worker_id)
        lost = await self.store.forget_worker(p.worker_id, self.config.heartbeat_stale_s,
                                              p.force)
        logger.info("worker %s forgotten", p.worker_id,
                    extra={"action": "worker_forget", "worker_id": p.worker_id})
        self._log_lost(p.worker_id, lost, "forgotten")
        return ReleasedResult(released=lost)

    async def workers(self, p: Empty | None = None) -> WorkersResult:
        """Every known worker with its readings, heartbeat age and per-priority gate
        verdicts (coordd.worker_list)."""
        book = await self.store.worker_book()
        return WorkersResult(workers=worker_views(
            book.rows, book.now, self.config.heartbeat_stale_s, self._policies, book.states,
            book.notes, book.grants, book.reserved))

    async def annotate(self, job: JobView) -> JobView:
        """Add to a `get_job` view its lease's suspension and grant, its request, its
        preemptions and, waiting with a live reservation, what it waits for (as
        coordd.governor on SQLite)."""
        g = await self.store.job_governance(job.job_id)
        job.preemptions = g.preemptions
        job.resources = None if g.request is None else msgspec.structs.asdict(g.request)
        if job.lease is not None:
            job.lease.governance = g.suspension
            job.granted = governor.granted_view(g.grant)
        if job.status == "waiting":
            job.waiting_reason = governor.reserved_reason(g.reservation, None) \
                or job.waiting_reason
        return job

    async def metrics(self, p: Empty | None = None) -> MetricsResult:
        """Refresh the gauges from a `status` read and return every series in Prometheus
        text format (no writer queue nor files here: those read 0)."""
        self.meters.set_status(await self.status(), 0, 0)
        return MetricsResult(text=self.meters.render())
