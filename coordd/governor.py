"""The Coordinator's governance of running work: the heartbeat and renew steps of
coordd.governance and coordd.preemption, their counts, and what `get_job` / `workers`
show of them. Kept beside coordd.service so the service stays a list of operations.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from typing import Any

import msgspec

from coordd import explain, governance, leases, preemption, resources, views
from coordd.config import Config
from coordd.gates import GatePolicy
from coordd.metrics import Metrics
from coordd.protocol import JobView, Renew, RenewResult
from coordd.protocol_governance import JobAction
from coordd.store import governance as govstore
from coordd.store import resources as resstore
from coordd.store import workers as wkstore
from coordd.times import fmt_time


def preemptor(config: Config) -> preemption.Preemptor:
    """The preemption pacer with the config's knobs (one per coordd, on either store)."""
    return preemption.Preemptor(preemption.PreemptPolicy(
        gap=config.preempt_gap, min_runtime_s=config.preempt_min_runtime_s,
        reservation_s=config.reservation_s, stale_s=config.heartbeat_stale_s))


def granted_view(grant: resources.Grant | None) -> dict[str, Any] | None:
    """A lease's grant as `get_job` shows it (`granted`), or None."""
    return None if grant is None else {
        "gpu_ids": list(grant.gpu_ids), "vram_mb": grant.vram_mb, "ram_mb": grant.ram_mb}


def reserved_reason(held: tuple[Any, ...] | None, now: float | None) -> str | None:
    """A waiting job's reason from its reservation (worker_id, victim job, victim
    priority, expires_at), while it lives at `now` (None: the store found it live);
    None otherwise."""
    if held is None or (now is not None and held[3] <= now):
        return None
    return (f"reserved on {held[0]}: waiting for P{held[2]} job {held[1]} to vacate "
            f"(until {fmt_time(held[3])})")


class HeartbeatGovernance(msgspec.Struct):
    """What one heartbeat's transaction decided: actions per held job, transitions
    [(action, reason code)], preemptions [(waiting job, victim, worker)]."""

    actions: list[JobAction]
    changes: list[tuple[str, str]]
    preempted: list[tuple[str, str, str]]


class Governor:
    """Governance steps for the Coordinator's writer ops and reads (`read(fn, *args)`)."""

    def __init__(self, config: Config, policies: dict[int, GatePolicy], meters: Metrics,
                 read: Any) -> None:
        self._policies, self._meters, self._read = policies, meters, read
        self._stale_s = config.heartbeat_stale_s
        self._preempt = preemptor(config)
        self.reservations = self._preempt.hint  # whether a reservation may exist

    def on_heartbeat(self, conn: sqlite3.Connection, now: float,
                     worker_id: str) -> HeartbeatGovernance:
        """Inside the heartbeat's transaction: preempt (paced), then decide for every job
        `worker_id` holds."""
        preempted = self._preempt.run(conn, now, self._policies)
        actions, changes = governance.govern(conn, now, worker_id, self._policies)
        return HeartbeatGovernance(actions, changes, preempted)

    def count(self, worker_id: str, gov: HeartbeatGovernance) -> None:
        """After the commit: metrics and log lines of what a heartbeat decided."""
        self._meters.count_governance(worker_id, gov.changes, gov.preempted)

    async def renew(self, writer: Any, p: Renew, lease_s: float) -> RenewResult:
        """`renew` with the job's governance action (see coordd.leases.renew for errors)."""
        def op(conn: sqlite3.Connection, now: float) -> Any:
            res = leases.renew(conn, now, p.job_id, p.worker_id, p.token, lease_s)
            return res, governance.govern(conn, now, p.worker_id, self._policies, p.job_id)
        res, (actions, changes) = await writer.run(op, urgent=True)
        self._meters.count_governance(p.worker_id, changes)
        res.action = actions[0] if actions else None
        return res

    async def annotate(self, job: JobView, now: float) -> None:
        """Add to a `get_job` view its lease's suspension and, for a waiting job with a
        live reservation, what it waits for."""
        req = await self._read(resstore.request_of, job.job_id)
        job.resources = None if req is None else msgspec.structs.asdict(req)
        if job.lease is not None:
            job.lease.governance = await self._read(govstore.lease_state, job.job_id)
            job.granted = granted_view(await self._read(resstore.grant_of, job.job_id))
        if job.status != "waiting":
            return
        why = reserved_reason(await self._read(govstore.reservation_of, job.job_id), now)
        if why is not None:
            job.waiting_reason = why
        elif req is not None:
            await self.explain_resources([job], await self._read(views.list_workers),
                                         await self._read(wkstore.worker_states), now)

    async def explain_resources(self, jobs: list[JobView], workers: list[Any],
                                states: dict[str, wkstore.WorkerState], now: float) -> None:
        """For the waiting jobs the gates call runnable that ask for resources, say which
        resource is short on which live worker that could run them (coordd.resources.
        shortfall); `workers` as views.list_workers returns them, `states` their
        lifecycle states."""
        runnable = [j for j in jobs if (j.waiting_reason or "").startswith("runnable")]
        if not runnable:
            return
        reqs = await self._read(resstore.requests_of, [j.job_id for j in runnable])
        if not reqs:
            return
        grants = await self._read(resstore.all_grants)
        for j in runnable:
            if j.job_id in reqs:
                why = resources.shortfall(reqs[j.job_id], explain.open_runners(
                    j, now, workers, states, self._policies, self._stale_s), grants)
                j.waiting_reason = why or j.waiting_reason

    async def resource_books(self) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """(worker_id -> grants of its leases, worker_id -> requests its reservations
        wait for), for `workers` (coordd.resources.summary)."""
        return (await self._read(resstore.all_grants),
                await self._read(resstore.reserved_requests))

    async def worker_notes(self) -> defaultdict[str, list[str]]:
        """worker_id -> "governance: JOB suspended since T (reason)" notes for `workers`."""
        out: defaultdict[str, list[str]] = defaultdict(list)
        for worker_id, rows in (await self._read(govstore.governed)).items():
            out[worker_id] = ["governance: " + governance.describe(*g) for g in rows]
        return out
