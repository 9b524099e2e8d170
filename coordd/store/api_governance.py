"""The store interface of governance of running work and of workers (coordd.store.api's
rules: `now` None in production, a pinned Unix time in tests; the coordd.errors classes).

A governed heartbeat does in one transaction what the SQLite Coordinator's heartbeat
does: a new incarnation ends its predecessor's leases (`worker_lost`), the readings are
stored, preemption runs (paced, coordd.rules.preemption), and each held job gets its action
(coordd.rules.governance). Decisions are the pure functions of those modules on both stores.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from coordd.rules.gates import GatePolicy
from coordd.rules.preemption import Preemptor
from coordd.wire.protocol import HeartbeatResult, RenewResult
from coordd.store.api import LeaseRef


class Governance(msgspec.Struct, kw_only=True):
    """What governed calls need from the config: gate policies per priority and the
    preemption pacer (its policy and last scan: one per coordd)."""

    policies: dict[int, GatePolicy]
    preemptor: Preemptor


class WorkerBeat(msgspec.Struct, kw_only=True, frozen=True):
    """A heartbeat's part beyond roles and readings, checked and encoded
    (coordd.service.lifecycle.heartbeat_state)."""

    incarnation: str | None = None
    kinds_json: str | None = None
    broken_json: str | None = None


class GovernedHeartbeat(msgspec.Struct, kw_only=True):
    """What a governed heartbeat did: the reply (`now`, `cancel`, `lost`, `actions`), the
    governance transitions [(action, reason code)] and preemptions [(waiting job,
    victim, worker)] for the metrics and logs, and (priority, gates JSON) of each held job
    (the thresholds a later beat must not cross to be quiet, coordd.rules.governance_beat)."""

    result: HeartbeatResult
    changes: list[tuple[str, str]] = []
    preempted: list[tuple[str, str, str]] = []
    held: list[tuple[int, str | None]] = []


class WorkerBook(msgspec.Struct, kw_only=True):
    """What `workers` is built from (coordd.rules.worker_list.worker_views): the store's `now`,
    rows (worker_id, roles, readings, heartbeat_at, active leases), worker_id ->
    WorkerState, governance notes, grants of its leases, requests its reservations hold."""

    now: float
    rows: list[tuple[str, list[str], dict[str, Any], float, int]]
    states: dict[str, Any]
    notes: dict[str, list[str]]
    grants: dict[str, list[Any]] = {}
    reserved: dict[str, list[Any]] = {}


class JobGovernance(msgspec.Struct, kw_only=True):
    """What `get_job` adds for governance: the lease's suspension (None: running
    normally, or no lease), releases that spent no attempt, its resource request and
    grant, and the job's reservation
    (worker_id, victim job, victim priority, expires_at) while it lives by the store's
    clock, else None."""

    suspension: Any = None
    preemptions: int = 0
    reservation: tuple[Any, ...] | None = None
    request: Any = None  # coordd.rules.resources.Request the job asks for, or None
    grant: Any = None  # coordd.rules.resources.Grant its lease holds, or None


class ExplainBook(msgspec.Struct, kw_only=True):
    """What says why waiting jobs are not running (coordd.rules.explain): the store's `now`, the
    workers' rows and states (as in WorkerBook)."""

    now: float
    rows: list[tuple[str, list[str], dict[str, Any], float, int]]
    states: dict[str, Any]


class GovernanceStore(Protocol):
    """Governance of running work, goodbyes and the workers' view, on one store."""

    async def heartbeat_governed(self, worker_id: str, roles: Sequence[str],
                                 readings: dict[str, Any], beat: WorkerBeat, gov: Governance,
                                 *, now: float | None = None) -> GovernedHeartbeat:
        """Record the heartbeat and decide for every job the worker holds (see the
        module docstring)."""
        ...

    async def touch_workers(self, seen: Sequence[tuple[str, float, dict[str, Any] | None]],
                            gov: Governance, *, now: float | None = None
                            ) -> list[tuple[str, str, str]]:
        """One batch: each worker's heartbeat time becomes at least the store's now minus
        its age (s), and its stored readings the latest quiet beat's where given, for
        [(worker_id, age_s, readings or None)] kept in memory (coordd.service.beats); then
        preemption runs (paced) as a heartbeat would run it. Returns the preemptions
        [(waiting job, victim, worker)]."""
        ...

    async def liveness_grace(self, bound_s: float, stale_s: float, *,
                             now: float | None = None) -> int:
        """At start: a worker not offline whose stored heartbeat time s may still be live
        (s > now - stale_s - bound_s) is taken as seen at min(now, s + bound_s), since a
        quiet beat up to `bound_s` later may not have been stored. Returns how many."""
        ...

    async def renew_governed(self, ref: LeaseRef, lease_s: float, gov: Governance, *,
                             now: float | None = None
                             ) -> tuple[RenewResult, list[tuple[str, str]]]:
        """`renew` (fenced, same errors) with the job's action in `action`, and the
        governance transitions it made."""
        ...

    async def goodbye(self, worker_id: str, incarnation: str | None, *,
                      now: float | None = None) -> list[str]:
        """The worker is offline now; its leases end (`worker_lost`, as the reaper would
        end them, without waiting for expiry). A goodbye of another incarnation changes
        nothing. Returns the released job ids. Raises: errors.NotFound (no such worker)."""
        ...

    async def forget_worker(self, worker_id: str, stale_s: float, force: bool, *,
                            now: float | None = None) -> list[str]:
        """Drop a worker's row; its leases end (`worker_lost`). Returns the released job
        ids. Raises: errors.NotFound; errors.InvalidState (live within `stale_s`, or
        holding leases, and not `force`)."""
        ...

    async def worker_book(self, *, now: float | None = None) -> WorkerBook:
        """Every known worker's row, state, governance notes and resource books."""
        ...

    async def job_governance(self, job_id: str, *, now: float | None = None) -> JobGovernance:
        """The job's governance as `get_job` shows it (nothing for an unknown job)."""
        ...

    async def explain_book(self, *, now: float | None = None) -> ExplainBook:
        """The workers to explain waiting jobs by."""
        ...

    async def resource_book(self, job_ids: Sequence[str]
                            ) -> tuple[dict[str, Any], dict[str, list[Any]]]:
        """(job_id -> its resource request, for the jobs of `job_ids` that ask for
        resources; worker_id -> the grants of its leases, read only when one asks), to
        say which resource is short (coordd.rules.resources.shortfall)."""
        ...


__all__ = ["ExplainBook", "Governance", "GovernanceStore", "GovernedHeartbeat", "JobGovernance",
           "WorkerBeat",
           "WorkerBook"]
