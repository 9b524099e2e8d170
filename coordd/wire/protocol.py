"""The wire schema: msgspec Structs for every request and reply. Data only, no I/O.

Frame: 4-byte big-endian unsigned length N, then N bytes of msgpack
(docs/reference/protocol.md). A request is `{"id": int, "method": str, "params": map}`;
a reply is `{"id": int, "result": ...}` or `{"id": int, "error": {"code": str, "message":
str}}`.
Times are Unix seconds (float); durations are seconds; job ids are strings.

Evolution rules (msgspec docs/schema-evolution.rst): new fields get defaults and go last;
a field's type never changes; wire Structs never forbid unknown fields.
"""

from __future__ import annotations

from typing import Any

import msgspec

from coordd.wire.claims import ClaimAsk
from coordd.wire.governance import JobAction
from coordd.wire.limits import LimitUse
# what coordd shows (jobs, workers, status, admin results) lives in coordd.wire.views
from coordd.wire.views import (  # noqa: F401 (re-exported)
    ArtifactRef, BackupResult, EventView, JobList, JobView, LeaseView, MetricsResult,
    PruneResult, StatusReply, WaitingJob, WorkersResult, WorkerView,
)

MAX_FRAME_DEFAULT = 16 << 20  # 16 MiB; client and server both enforce an explicit cap
PRIORITIES = (0, 1, 2, 3)
ATTEMPTS_MAX = (1 << 31) - 1  # max_attempts, a log's attempt: both stores' int column
JOB_STATUSES = ("waiting", "running", "succeeded", "failed", "cancelled", "blocked", "skipped")
TERMINAL_STATUSES = ("succeeded", "failed", "cancelled", "skipped")  # blocked: see workflows


class Request(msgspec.Struct, kw_only=True):
    """The request envelope; `params` is decoded later by the method's own Struct."""

    id: int
    method: str
    params: msgspec.Raw = msgspec.Raw(b"\x80")  # an empty msgpack map


ERROR_CODES = ("bad_request", "unknown_method", "not_found", "lease_expired", "lease_lost",
               "already_completed", "invalid_state", "gate_refused", "payload_too_large",
               "permission_denied", "overloaded", "unavailable", "internal")
"""The stable wire error codes (coordd.errors has one class per code). `overloaded` and
`unavailable` (storage: disk full, I/O error; the reason is in the message) are retryable:
nothing was stored."""


class ErrorBody(msgspec.Struct):
    """A wire error: `code` is one of ERROR_CODES (coordd.errors)."""

    code: str
    message: str


class Reply(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The reply envelope: exactly one of `result` / `error` is set."""

    id: int
    result: Any = None
    error: ErrorBody | None = None


class ReplyHeader(msgspec.Struct, kw_only=True):
    """What a client decodes first: the id, the error, and the result left raw."""

    id: int
    result: msgspec.Raw = msgspec.Raw(b"\xc0")
    error: ErrorBody | None = None


# ---------------------------------------------------------------- requests (params)


class Empty(msgspec.Struct):
    """Params of methods that take none (`reap`, `status`, `workers`, `metrics`)."""


class Readings(msgspec.Struct, kw_only=True):
    """The resource readings a heartbeat carries (null = the machine can't tell).

    These are the keys gates read, type-checked on every heartbeat. Free-form extra keys
    are kept in the stored heartbeat as sent; the probes add `temperature_reason`,
    `power_reason` and `user_idle_reason` there, which `workers` shows for null readings.
    """

    memory_used_pct: float | None = None
    temperature_c: float | None = None
    on_battery: bool | None = None
    user_idle_s: float | None = None
    battery_pct: float | None = None
    gpu_temperature_c: float | None = None  # the hottest GPU (worker.gpu)
    gpus: int | None = None  # GPUs advertised; `gpu_devices` lists them (coordd.rules.resources)
    gpu_devices: list[dict[str, Any]] | None = None
    ram_mb: float | None = None  # RAM offered to jobs (MiB)
    kind_resources: dict[str, dict[str, int]] | None = None  # per-kind default requests


class Heartbeat(msgspec.Struct, kw_only=True):
    """`heartbeat`: the worker's roles and readings (a map; see `Readings`)."""

    worker_id: str  # unique in the fleet (on TLS: the certificate's)
    roles: list[str]  # the roles whose jobs it takes (a job's required_role)
    readings: dict[str, Any] = {}  # see Readings; null: the machine cannot tell
    incarnation: str | None = None  # an id per worker start: a new one ends the old leases
    kinds: list[str] | None = None  # the kinds it claims (None: not said)
    broken_kinds: dict[str, str] = {}  # kind -> why this worker cannot run it


class Enqueue(msgspec.Struct, kw_only=True):
    """`enqueue`: one job. `payload` must be JSON-compatible.

    A repeated `idempotency_key` with another request is refused (`invalid_state`).
    `gates` optionally overrides the priority's gate policy for this job (same keys as
    coordd.rules.gates.GatePolicy). `max_runtime_s` makes coordd refuse renewals past it.
    """

    kind: str  # selects the model command on the worker ([kinds.NAME])
    required_role: str  # only a worker advertising this role claims it
    priority: int  # 0 (a user waiting) .. 3 (idle work)
    payload: Any = None  # JSON-compatible, at most max_payload_bytes encoded
    run_at: float | None = None  # not before this time (Unix seconds)
    max_attempts: int | None = None  # None: coordd's max_attempts_default
    idempotency_key: str | None = None  # a repeat with the same request returns the same job
    max_runtime_s: float | None = None  # renewals past this much running are refused
    gates: dict[str, Any] | None = None  # GatePolicy keys overriding its priority's policy
    result_schema: str | None = None  # a name in coordd.rules.results.SCHEMAS (checked at complete)
    delay_s: float | None = None  # not before coordd's now + this (instead of run_at)
    resources: dict[str, Any] | None = None  # {gpus, vram_mb (per GPU), ram_mb}: coordd.rules.resources
    # fleet-wide limits it consumes (coordd.rules.limits): names or {name, units}; None = the
    # kind's default from coordd's config, [] = none
    limits: list[str | LimitUse] | None = None


class EnqueueBatch(msgspec.Struct, kw_only=True):
    """`enqueue_batch`: many jobs in one transaction (all or none); errors say `jobs[i]: `."""

    jobs: list[Enqueue]


class Claim(msgspec.Struct, kw_only=True):
    """`claim`: `claim_id` makes a repeated claim return the lease it already granted;
    `kinds` limits the claim to the job kinds the worker can run; `wait_s` parks it while
    nothing is claimable (coordd.service.waits)."""

    worker_id: str
    lease_s: float | None = None  # None: lease_default_s; clamped to lease_min_s..lease_max_s
    claim_id: str | None = None  # a repeat returns the lease this claim already granted
    kinds: list[str] | None = None  # only jobs of these kinds (None = any kind)
    wait_s: float = 0.0  # nothing claimable: park up to this long (coordd caps it; 0 = no)
    # up to this many jobs (1..64), each with its own lease, as that many claims in a row
    # would take them; the first in `job`/`lease`, the others in the result's `more`
    max_jobs: int = 1


class LeaseRef(msgspec.Struct, kw_only=True):
    """The fencing triple every lease-holder call presents."""

    job_id: str
    worker_id: str  # the lease holder
    token: int  # the fencing token of the claim (a newer claim's token fences this one)


class Renew(LeaseRef, kw_only=True):
    """`renew`: extend the lease by `lease_s` from now (coordd's clock)."""

    lease_s: float | None = None


class Checkpoint(LeaseRef, kw_only=True):
    """`checkpoint`: record the latest checkpoint (JSON-compatible, small; files go to artifacts)."""

    checkpoint: Any = None


class Complete(LeaseRef, kw_only=True):
    """`complete`: the job's result (JSON-compatible) or a reference to a stored artifact."""

    result: Any = None
    artifact: ArtifactRef | None = None
    usage: dict[str, float] | None = None  # e.g. {"tokens": 1234}: counted by limit budgets
    next: ClaimAsk | None = None  # then claim the worker's next job (coordd.wire.claims)


class Fail(LeaseRef, kw_only=True):
    """`fail`: `retryable` False means permanent (dead letter at once)."""

    error: str = ""  # why (truncated to max_error_chars)
    retryable: bool = True  # True: back to waiting after a backoff, while attempts remain
    next: ClaimAsk | None = None  # then claim the worker's next job (coordd.wire.claims)


class JobId(msgspec.Struct, kw_only=True):
    """`cancel`, `retry`: one job id."""

    job_id: str


class GetJob(JobId, kw_only=True):
    """`get_job`: with `prefix`, `job_id` may be the start of one job's id."""

    prefix: bool = False


class ListJobs(msgspec.Struct, kw_only=True):
    """`list_jobs`: filters (all optional), page size and the last id of the previous page."""

    status: str | None = None
    kind: str | None = None
    role: str | None = None
    priority: int | None = None
    limit: int = 100
    after: str | None = None
    newest_first: bool = False  # newest first; `after` then pages towards older jobs


class Backup(msgspec.Struct, kw_only=True):
    """`backup`: a path on coordd's host for a consistent, verified copy of the database."""

    dest: str


# ---------------------------------------------------------------- results


class ClaimedJob(msgspec.Struct, kw_only=True):
    """The job a claim hands out."""

    job_id: str
    kind: str
    required_role: str
    priority: int
    payload: Any
    attempts: int
    checkpoint: Any = None
    max_runtime_s: float | None = None
    gpu_ids: list[int] | None = None  # the GPUs granted (coordd.rules.resources): CUDA_VISIBLE_DEVICES


class LeaseGrant(msgspec.Struct, kw_only=True):
    """A granted lease: time it on your own monotonic clock from when you sent the request."""

    token: int
    expires_at: float
    lease_s: float


class Granted(msgspec.Struct, kw_only=True):
    """One more job a claim with `max_jobs` > 1 took, under its own lease."""

    job: ClaimedJob  # as a claim's `job`
    lease: LeaseGrant  # its own lease and fencing token


class ClaimResult(msgspec.Struct, kw_only=True):
    """`claim` result: a job and lease, or `job=None` with the refusal reason codes."""

    job: ClaimedJob | None = None
    lease: LeaseGrant | None = None
    reasons: list[str] = []
    detail: str = ""
    waited_s: float = 0.0  # seconds the claim was parked before the claim that answered it
    next_slot_s: float | None = None  # refused by a limit's rate: seconds until a unit frees
    # the 2nd..nth jobs of a claim with max_jobs > 1, in claim order (`reasons`: why no more)
    more: list[Granted] = []


class HeartbeatResult(msgspec.Struct, kw_only=True):
    """`heartbeat` result: coordd's time and the held jobs whose cancel was requested."""

    now: float
    cancel: list[str] = []
    artifact_dir: str | None = None  # coordd's content-addressed store (same host only)
    lost: list[str] = []  # jobs of a predecessor incarnation, released (`worker_lost`)
    actions: list[JobAction] = []  # one per held job (coordd.rules.governance)


class EnqueueResult(msgspec.Struct, kw_only=True):
    """`enqueue` result: `created` False means the idempotency key already named this job."""

    job_id: str
    created: bool


class EnqueueBatchResult(msgspec.Struct, kw_only=True):
    """`enqueue_batch` result, in request order."""

    jobs: list[EnqueueResult]


class RenewResult(msgspec.Struct, kw_only=True):
    """`renew` result."""

    expires_at: float
    lease_s: float
    cancel_requested: bool
    action: JobAction | None = None  # coordd.rules.governance: what the job must be doing now


class CompleteResult(msgspec.Struct, kw_only=True):
    """`complete` result: `cancelled` if a cancel was requested first (the result is dropped);
    `waiting` or `failed` if the result failed its schema (`error` says why; attempt spent)."""

    status: str = "succeeded"
    error: str | None = None
    # asked `next`: the next claim's result (job None: nothing due; park a claim). Absent
    # from an older coordd's reply: it does not claim on complete
    next: ClaimResult | None = None


class StatusResult(msgspec.Struct, kw_only=True):
    """`fail` / `cancel` / `retry` result: the job's status afterwards (and next run time)."""

    status: str
    run_at: float | None = None
    next: ClaimResult | None = None  # `fail`, `release` asked `next`: as CompleteResult's


class ReapResult(msgspec.Struct, kw_only=True):
    """`reap` result: how many expired leases were returned to waiting or failed."""

    reaped: int


PARAMS: dict[str, type[msgspec.Struct]] = {
    "heartbeat": Heartbeat,
    "enqueue": Enqueue,
    "enqueue_batch": EnqueueBatch,
    "claim": Claim,
    "renew": Renew,
    "checkpoint": Checkpoint,
    "complete": Complete,
    "fail": Fail,
    "cancel": JobId,
    "retry": JobId,
    "reap": Empty,
    "status": Empty,
    "get_job": GetJob,
    "list_jobs": ListJobs,
    "workers": Empty,
    "backup": Backup,
    "check": Empty,
    "metrics": Empty,
    "prune": Empty,
}
"""Every RPC method and its params Struct."""

ADMIN_METHODS = frozenset({"enqueue", "enqueue_batch", "cancel", "retry", "reap", "backup",
                           "prune"})
"""Methods limited to the configured admin uids/gids."""


# ---------------------------------------------------------------- agent message hub (issue 9)
# Its Structs live in coordd.wire.hub; re-exported here, where the hub's users import them.
from coordd.wire.hub import (  # noqa: E402
    HUB_PARAMS,
    AckMessages, AckResult, AgentQuery, AgentsResult, AgentStatusUpdate,  # noqa: F401
    AgentView, BroadcastMessage, MessageView, ReadMessages, ReadResult,  # noqa: F401
    SendMessage, SendResult,  # noqa: F401
)

PARAMS.update(HUB_PARAMS)


# ---------------------------------------------------------------- workflows (issue 8)
# Their Structs live in coordd.wire.workflows (this module's size); registered here.
from coordd.wire.workflows import WORKFLOW_ADMIN_METHODS, WORKFLOW_PARAMS  # noqa: E402

PARAMS.update(WORKFLOW_PARAMS)
ADMIN_METHODS = ADMIN_METHODS | WORKFLOW_ADMIN_METHODS

# ---------------------------------------------------------------- worker lifecycle (issue 14)
from coordd.wire.workers import WORKER_ADMIN_METHODS, WORKER_PARAMS  # noqa: E402

PARAMS.update(WORKER_PARAMS)
ADMIN_METHODS = ADMIN_METHODS | WORKER_ADMIN_METHODS
# ---------------------------------------------------------------- output (issue 14), push (15)
from coordd.wire.logs import LOG_PARAMS  # noqa: E402
from coordd.wire.push import PUSH_PARAMS  # noqa: E402
from coordd.wire.web import WEB_PARAMS  # noqa: E402  (the web view's reads, issue 19)
PARAMS.update(LOG_PARAMS | PUSH_PARAMS | WEB_PARAMS)
# ---------------------------------------------------------------- fleet-wide limits (17)
from coordd.wire.limits import LIMIT_ADMIN_METHODS, LIMIT_PARAMS  # noqa: E402

PARAMS.update(LIMIT_PARAMS)
ADMIN_METHODS = ADMIN_METHODS | LIMIT_ADMIN_METHODS
# ---------------------------------------------------------------- enrolment (issue 18)
from coordd.wire.enrol import ENROL_ADMIN_METHODS, ENROL_PARAMS  # noqa: E402
from coordd.wire.transfers import TRANSFER_PARAMS  # noqa: E402
PARAMS.update(ENROL_PARAMS | TRANSFER_PARAMS)
ADMIN_METHODS = ADMIN_METHODS | ENROL_ADMIN_METHODS
