"""Wire Structs of the read-only methods the web view needs (issue 19). Data only, no I/O.

Registered in coordd.wire.protocol's PARAMS; none is an admin method and none writes. Same
evolution rules as coordd.wire.protocol: new fields get defaults and go last.
"""

from __future__ import annotations

import msgspec

FIND_LIMIT_MAX = 200      # rows one `find_jobs` page carries at most
FIND_SCAN_DEFAULT = 10000  # jobs one `find_jobs` page looks at, newest first
FIND_SCAN_MAX = 200000
COUNT_CAP = 1000          # `find_jobs` counts matches up to this


class FindJobs(msgspec.Struct, kw_only=True):
    """`find_jobs`: jobs newest first, every given filter matching; keyset-paged.

    Newest by enqueue; with a `status`, by last change (the most recently failed first).
    `worker`: jobs a worker ever held (from the event log); `text`: a substring of the
    payload or the last error, any case of ASCII letters (other letters match as typed:
    SQLite's lower() folds ASCII only). A page looks at no more than `scan` jobs after
    the job `before`: `next_before` continues where it stopped, whether or not it filled
    the page, so each page costs at most `scan` rows however rare the match.
    """

    status: str | None = None
    kind: str | None = None
    role: str | None = None
    priority: int | None = None
    worker: str | None = None
    workflow_id: str | None = None
    text: str | None = None
    limit: int = 50
    before: str | None = None
    scan: int = FIND_SCAN_DEFAULT


class JobRow(msgspec.Struct, kw_only=True):
    """One job in a `find_jobs` page: the columns a list shows (no payload or result)."""

    job_id: str
    kind: str
    required_role: str
    priority: int
    status: str
    attempts: int
    max_attempts: int
    created_at: float
    updated_at: float
    run_at: float
    last_error: str | None = None
    worker_id: str | None = None  # the lease holder, while it runs
    lease_expires_at: float | None = None
    workflow_id: str | None = None
    node: str | None = None
    waiting_reason: str | None = None  # a waiting job: why it is not running (as `list`)


class FoundJobs(msgspec.Struct, kw_only=True):
    """`find_jobs` result. `count`: matches among the jobs looked at, up to COUNT_CAP
    (`count_capped` True past it; `exact` True where it is the stored total, from the
    status counters); `next_before`: the cursor of the next (older) page, None at the end;
    `scanned`: jobs looked at for this page."""

    jobs: list[JobRow]
    next_before: str | None = None
    scanned: int = 0
    count: int = 0
    count_capped: bool = False
    exact: bool = False


class JobStats(msgspec.Struct, kw_only=True):
    """`job_stats`: counts by status and priority, and finished jobs per time bucket over
    the last `window_s` seconds (`bucket_s` each)."""

    window_s: float = 3600.0
    bucket_s: float = 60.0


class JobStatsResult(msgspec.Struct, kw_only=True):
    """`job_stats` result. `counts`: status -> [P0, P1, P2, P3]; `bucket_starts`: Unix
    times, whole multiples of `bucket_s` (the last bucket holds `now`); `succeeded`,
    `failed`, `cancelled`, `skipped`: jobs that ended so per bucket, each job once at its
    last terminal event (a retried attempt is not an end); `events_scanned`: events looked
    at (the newest EVENTS_SCAN_MAX at most); `head_event_id`: the feed's newest event id
    (the cursor live updates start from)."""

    now: float
    counts: dict[str, list[int]]
    bucket_starts: list[float]
    succeeded: list[int]
    failed: list[int]
    events_scanned: int = 0
    head_event_id: int = 0
    cancelled: list[int] = []
    skipped: list[int] = []


class HeldLease(msgspec.Struct, kw_only=True):
    """A live lease: who holds which job until when."""

    worker_id: str
    job_id: str
    kind: str
    priority: int
    granted_at: float
    expires_at: float


class Reservation(msgspec.Struct, kw_only=True):
    """Capacity a worker keeps for a preempting job until `expires_at`."""

    worker_id: str
    job_id: str
    victim_job_id: str
    expires_at: float


class FleetResult(msgspec.Struct, kw_only=True):
    """`fleet` result: live leases, reservations, and each worker's recent readings as
    [at, {reading: value}] pairs, oldest first (kept in coordd's memory, not stored: a
    restart starts them afresh)."""

    now: float
    held: list[HeldLease] = []
    reservations: list[Reservation] = []
    readings: dict[str, list[tuple[float, dict[str, float]]]] = {}
    head_event_id: int = 0


class NodeRun(msgspec.Struct, kw_only=True):
    """One attempt of a workflow node: claimed at `start`, ended at `end` (None: still
    running) with status `outcome` (the event's to_status)."""

    node: str
    job_id: str
    worker_id: str | None
    start: float
    end: float | None = None
    outcome: str | None = None


class WorkflowRuns(msgspec.Struct, kw_only=True):
    """`workflow_runs` result: every node attempt of one workflow, by start."""

    runs: list[NodeRun]


class MessageLog(msgspec.Struct, kw_only=True):
    """`message_log`: hub messages newest first, before the message `before`."""

    limit: int = 50
    before: str | None = None


class Delivery(msgspec.Struct, kw_only=True):
    """One reader's delivery state of a message."""

    reader: str
    deliveries: int
    delivered_at: float
    visible_at: float | None = None
    processed_at: float | None = None


class LoggedMessage(msgspec.Struct, kw_only=True):
    """A message with its delivery history (content shortened to a preview)."""

    message_id: str
    sender: str
    recipient: str | None
    message_type: str
    priority: int
    status: str
    created_at: float
    processed_at: float | None
    expires_at: float | None
    preview: str
    deliveries: list[Delivery] = []


class MessageLogResult(msgspec.Struct, kw_only=True):
    """`message_log` result: `next_before` continues to older messages (None at the end)."""

    messages: list[LoggedMessage]
    next_before: str | None = None


class WorkflowRef(msgspec.Struct, kw_only=True):
    """`workflow_runs`: one workflow id."""

    workflow_id: str


class NoParams(msgspec.Struct):
    """Params of `fleet` and `feed_head` (none)."""


class FeedHead(msgspec.Struct, kw_only=True):
    """`feed_head` result: the event feed's newest id (where live updates start)."""

    event_id: int


WEB_PARAMS: dict[str, type[msgspec.Struct]] = {
    "find_jobs": FindJobs,
    "job_stats": JobStats,
    "fleet": NoParams,
    "workflow_runs": WorkflowRef,
    "message_log": MessageLog,
    "feed_head": NoParams,
}
"""The web view's read-only methods (served by coordd.service.web_reads)."""
