"""Wire Structs of the parked (long-poll) methods (issue 15). Data only, no I/O.

Registered in coordd.wire.protocol's PARAMS (kept apart for that module's size). `claim`'s
own `wait_s` is a field of protocol.Claim. Same evolution rules: new fields get defaults
and go last; a field's type never changes.
"""

from __future__ import annotations

from typing import Any

import msgspec

FEED_CURSOR_MAX = (1 << 63) - 1  # `watch_events` cursors: SQLite rowids / PostgreSQL bigints


class WaitJob(msgspec.Struct, kw_only=True):
    """`wait_job`: answer once the job is terminal, or after `timeout_s` (coordd caps it)."""

    job_id: str
    timeout_s: float = 30.0


class WaitJobResult(msgspec.Struct, kw_only=True):
    """`wait_job` result: the job view (coordd.wire.protocol.JobView fields) and whether it is
    terminal; `terminal` False means the timeout passed first."""

    job: Any
    terminal: bool


class WorkerActions(msgspec.Struct, kw_only=True):
    """Actions coordd asks of a worker, as job ids per action.

    `cancel`: end the job (SIGTERM, grace, SIGKILL) and report it. `suspend` / `vacate` are
    coordd's governance state of each held lease (coordd.rules.governance; level, not edge: a
    job stays listed while it holds). `resume` stays empty here: a resume is decided on the
    worker's own heartbeat, whose reply carries it. `reasons`: job id -> the reason of its
    suspend or vacate.
    """

    cancel: list[str] = []
    suspend: list[str] = []
    resume: list[str] = []
    vacate: list[str] = []
    reasons: dict[str, str] = {}


class WatchWorker(msgspec.Struct, kw_only=True):
    """`watch_worker`: answer as soon as the actions for the jobs `worker_id` holds hold an
    id not in `seen` (what the caller was already told), else after `wait_s`."""

    worker_id: str
    wait_s: float = 30.0
    seen: WorkerActions = msgspec.field(default_factory=WorkerActions)


class EventFilter(msgspec.Struct, kw_only=True):
    """Which events `watch_events` returns (every given field must match; none = all)."""

    job_id: str | None = None
    workflow_id: str | None = None
    kind: str | None = None
    to_status: list[str] | None = None


class WatchEvents(msgspec.Struct, kw_only=True):
    """`watch_events`: events with id > `after`, parked up to `wait_s` while there are none."""

    after: int = 0
    wait_s: float = 0.0
    limit: int = 100
    filter: EventFilter = msgspec.field(default_factory=EventFilter)


class FeedEvent(msgspec.Struct, kw_only=True):
    """One `job_events` row with its job's kind and workflow."""

    event_id: int
    job_id: str
    at: float
    worker_id: str | None
    from_status: str | None
    to_status: str
    reason: str | None
    kind: str | None = None
    workflow_id: str | None = None
    node: str | None = None


class EventsResult(msgspec.Struct, kw_only=True):
    """`watch_events` result: matching events in id order; resume with `after=next_after`
    (past every event looked at, matching or not)."""

    events: list[FeedEvent]
    next_after: int


PUSH_PARAMS: dict[str, type[msgspec.Struct]] = {
    "wait_job": WaitJob,
    "watch_worker": WatchWorker,
    "watch_events": WatchEvents,
}
