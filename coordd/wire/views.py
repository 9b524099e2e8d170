"""The wire Structs of what coordd shows: jobs (`get_job`, `list_jobs`), workers, `status`,
and the admin results (`prune`, `metrics`, `backup`). Data only; re-exported by
coordd.wire.protocol, where their users import them.
"""

from __future__ import annotations

from typing import Any

import msgspec

from coordd.wire.governance import Suspension
from coordd.wire.limits import LimitUse


class ArtifactRef(msgspec.Struct, kw_only=True):
    """A content-addressed file in the artifact store beside the DB."""

    sha256: str
    size: int
    path: str


class EventView(msgspec.Struct, kw_only=True):
    """One row of the job's transition log."""

    at: float
    from_status: str | None
    to_status: str
    worker_id: str | None
    reason: str | None


class LeaseView(msgspec.Struct, kw_only=True):
    """The job's current lease."""

    worker_id: str
    token: int
    granted_at: float
    expires_at: float
    lease_s: float
    governance: Suspension | None = None  # suspended or vacating (coordd.rules.governance)


class JobView(msgspec.Struct, kw_only=True):
    """A stored job as `get_job` / `list_jobs` show it (`events` only from `get_job`)."""

    job_id: str
    kind: str
    required_role: str
    priority: int
    effective_priority: int
    status: str
    attempts: int
    max_attempts: int
    run_at: float
    created_at: float
    updated_at: float
    age_s: float
    payload: Any = None
    result: Any = None
    artifact: ArtifactRef | None = None
    last_error: str | None = None
    checkpoint: Any = None
    cancel_requested: bool = False
    idempotency_key: str | None = None
    max_runtime_s: float | None = None
    finished_at: float | None = None
    lease: LeaseView | None = None
    events: list[EventView] = []
    waiting_reason: str | None = None
    gates: dict[str, Any] | None = None  # the job's own gate overrides
    workflow_id: str | None = None  # `get_job` only: the workflow this job is a node of
    node: str | None = None
    result_schema: str | None = None
    preemptions: int = 0  # `get_job` only: hand-backs that spent no attempt (`release`)
    resources: dict[str, int] | None = None  # `get_job` only: its request (coordd.rules.resources)
    granted: dict[str, Any] | None = None  # `get_job` only: what its lease holds
    limits: list[LimitUse] = []  # `get_job` only: the fleet-wide limits it consumes


class JobList(msgspec.Struct, kw_only=True):
    """`list_jobs` result: `next_after` is the `after` for the next page (None at the end)."""

    jobs: list[JobView]
    next_after: str | None = None


class WorkerView(msgspec.Struct, kw_only=True):
    """A worker with its last readings and what each priority's gates say about it."""

    worker_id: str
    roles: list[str]
    readings: dict[str, Any]
    heartbeat_at: float
    heartbeat_age_s: float
    live: bool
    verdicts: dict[str, list[str]]  # "p0".."p3" -> refusal reason codes ([] = would claim)
    notes: list[str] = []
    active_leases: int = 0
    kinds: list[str] | None = None  # kinds it advertises (None: an older worker, any kind)
    broken_kinds: dict[str, str] = {}  # kind -> why the worker cannot run it
    incarnation: str | None = None
    offline_at: float | None = None  # when it said goodbye (not live since)
    resources: dict[str, Any] = {}  # GPUs, RAM: advertised, held, free (coordd.rules.resources.summary)


class WorkersResult(msgspec.Struct, kw_only=True):
    """`workers` result."""

    workers: list[WorkerView]


class WaitingJob(msgspec.Struct, kw_only=True):
    """One of the oldest due waiting jobs `status` shows: how long it has waited since it
    became runnable (s) and why it is not running (coordd.rules.explain)."""

    job_id: str
    kind: str
    required_role: str
    priority: int
    waited_s: float  # since it entered waiting, or since its backoff or schedule ended
    reason: str | None = None  # why it is not running, as `list` and `show` say it


class StatusReply(msgspec.Struct, kw_only=True):
    """`status` result. `jobs` always holds every status, zero where none."""

    workers: int
    workers_live: int
    active_leases: int
    jobs: dict[str, int]
    waiting_by_priority: dict[str, int] = {}
    db_bytes: int = 0
    wal_bytes: int = 0
    # queue latency: now - when the oldest due waiting job became runnable (enqueued, or its
    # backoff/schedule ended); jobs not yet due do not count; None: none (coordd.store.latency)
    oldest_waiting_age_s: float | None = None
    warnings: list[str] = []
    now: float = 0.0
    prunable: int = 0  # terminal jobs past `retention_s`, deleted by the next `prune`
    waiting: list[WaitingJob] = []  # the oldest due waiting jobs of each priority, P0 first


class PruneResult(msgspec.Struct, kw_only=True):
    """`prune` result: terminal jobs (and artifact rows) deleted, and the file's size after."""

    pruned: int
    artifacts: int = 0
    free_pages: int = 0
    db_bytes: int = 0
    artifact_files: int = 0  # files deleted from the artifact store (unreferenced, old)
    messages: int = 0  # hub messages purged (expired, or processed / broadcast past retention)
    agents: int = 0  # agents not heard from for message_retention_s, forgotten


class MetricsResult(msgspec.Struct, kw_only=True):
    """`metrics` result: every series in Prometheus text exposition format."""

    text: str


class BackupResult(msgspec.Struct, kw_only=True):
    """`backup` result: the copy's path, size in bytes, and its `PRAGMA quick_check` answer."""

    path: str
    bytes: int
    quick_check: str
    jobs: int
    artifacts: int = 0  # artifact files copied beside the copy (`<path>.artifacts/`)
    missing_artifacts: list[str] = []  # referenced, but not copied (the reasons: below)
    manifest: str = ""  # `<path>.manifest.json`: sha256 of the copy and of every artifact
    missing_reasons: dict[str, str] = {}  # sha256 -> absent | unreadable (...) | damaged (...)
