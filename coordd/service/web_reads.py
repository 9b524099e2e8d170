"""The web view's read-only methods (issue 19): `find_jobs`, `job_stats`, `fleet`,
`workflow_runs`, `message_log` (coordd.wire.web).

All read through the store interface (coordd.store.api_web; on SQLite and PostgreSQL
alike); none writes. The checks of filters, limits and windows, the waiting reasons and
the runs built from a workflow's events are decided here. The one thing kept
in memory is each worker's last READINGS_KEPT heartbeats' numeric readings, for the
workers page's sparklines: recorded after the heartbeat's commit, never stored, so the
heartbeat's transaction and the claim path are untouched.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Any

from coordd import errors
from coordd.rules.names import check_name
from coordd.wire.protocol import JOB_STATUSES, JobView
from coordd.wire.web import (
    COUNT_CAP, FIND_LIMIT_MAX, FeedHead, FIND_SCAN_MAX, FindJobs, FleetResult, FoundJobs,
    JobRow, JobStats, JobStatsResult, MessageLog, MessageLogResult, NodeRun, NoParams,
    WorkflowRef, WorkflowRuns,
)
from coordd.store.api_web import JobFinder

READINGS_KEPT = 120     # heartbeats kept per worker (at 5 s: the last 10 minutes)
READING_KEYS_MAX = 16   # numeric readings kept per heartbeat
WORKERS_KEPT = 1000     # workers whose readings are kept (the least recently heard go)
BUCKETS_MAX = 1440
ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
STATUS_ONLY = (0, 3)    # filter positions (status, priority) the status counters can count exactly


class ReadingsLog:
    """Each worker's recent numeric readings, oldest first, in memory only."""

    def __init__(self, kept: int = READINGS_KEPT, workers: int = WORKERS_KEPT) -> None:
        self._kept = kept
        self._workers = workers
        self._log: OrderedDict[str, deque[tuple[float, dict[str, float]]]] = OrderedDict()

    def add(self, worker_id: str, at: float, readings: dict[str, Any]) -> None:
        """Keep the finite numeric readings (bools left out) of one heartbeat."""
        kept: dict[str, float] = {}
        for key, value in readings.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value):
                kept[key] = float(value)
                if len(kept) == READING_KEYS_MAX:
                    break
        ring = self._log.pop(worker_id, None) or deque(maxlen=self._kept)
        ring.append((at, kept))
        self._log[worker_id] = ring
        while len(self._log) > self._workers:
            self._log.popitem(last=False)

    def snapshot(self) -> dict[str, list[tuple[float, dict[str, float]]]]:
        """worker_id -> [(at, readings)], oldest first."""
        return {w: list(ring) for w, ring in self._log.items()}


class WebReads:
    """The web view's methods over one store (coordd.store.api_web.WebReads and
    api_waits' `last_event_id`).

    Args:
        store: the Coordinator's store.
        clock_wall: coordd's wall clock.
        explain: the Coordinator's `explain_waiting(jobs, now)` (why a waiting job waits).
    """

    def __init__(self, store: Any, clock_wall: Callable[[], float],
                 explain: Callable[[list[JobView], float], Awaitable[None]] | None = None
                 ) -> None:
        self._store = store
        self._wall = clock_wall
        self._explain = explain
        self.readings = ReadingsLog()

    async def find_jobs(self, p: FindJobs) -> FoundJobs:
        """A page of jobs, newest first, matching every given filter (FindJobs).

        Raises: BadRequest (a bad status, priority, limit or scan), NotFound (`before`
        names no job).
        """
        if p.status is not None and p.status not in JOB_STATUSES:
            raise errors.BadRequest(f"status must be one of {', '.join(JOB_STATUSES)}")
        if p.priority is not None and p.priority not in (0, 1, 2, 3):
            raise errors.BadRequest(f"priority must be 0..3, got {p.priority}")
        if not 1 <= p.limit <= FIND_LIMIT_MAX:
            raise errors.BadRequest(f"limit must be 1..{FIND_LIMIT_MAX}, got {p.limit}")
        if not 1 <= p.scan <= FIND_SCAN_MAX:
            raise errors.BadRequest(f"scan must be 1..{FIND_SCAN_MAX}, got {p.scan}")
        for name in ("kind", "role", "worker", "workflow_id"):
            value = getattr(p, name)
            if value is not None:
                check_name(name, value)
        text = p.text.translate(ASCII_LOWER) if p.text else None  # as SQLite's lower()
        flt = JobFinder(status=p.status, kind=p.kind, role=p.role, priority=p.priority,
                        worker=p.worker, workflow_id=p.workflow_id, text=text)
        counting = any(f is not None for i, f in enumerate(flt.args()) if i not in STATUS_ONLY)
        jobs, found = await self._store.find_job_rows(
            flt, p.before, p.scan, COUNT_CAP + 1 if counting else p.limit, p.limit)
        await self._waiting_reasons(jobs)
        full = found > p.limit or (not counting and found == p.limit)
        if p.workflow_id is not None:  # by its index, not a window
            nxt = jobs[-1].job_id if full and jobs else None
            return FoundJobs(jobs=jobs, next_before=nxt, scanned=found,
                             count=min(found, COUNT_CAP), count_capped=found > COUNT_CAP,
                             exact=not full and p.before is None)
        if full and jobs:
            nxt: str | None = jobs[-1].job_id
        else:
            nxt = await self._store.find_window_end(p.status, p.before, p.scan)
        res = FoundJobs(jobs=jobs, next_before=nxt, scanned=p.scan)
        if not counting:  # status / priority only: the counters are exact
            total = 0
            for status, prio, n in await self._store.job_counts():
                if (p.status is None or status == p.status) \
                        and (p.priority is None or prio == p.priority):
                    total += n
            res.count, res.exact = total, True
        else:
            res.count, res.count_capped = min(found, COUNT_CAP), found > COUNT_CAP
        return res

    async def _waiting_reasons(self, jobs: list[JobRow]) -> None:
        """Fill in the waiting jobs' `waiting_reason` (as `list` explains them)."""
        ids = [j.job_id for j in jobs if j.status == "waiting"]
        if not ids or self._explain is None:
            return
        now = self._wall()
        views_: list[JobView] = []
        for job_id in ids:
            try:
                views_.append(await self._store.get_job(job_id))
            except errors.NotFound:  # gone since its page was read
                continue
        await self._explain(views_, now)
        why = {v.job_id: v.waiting_reason for v in views_}
        for j in jobs:
            j.waiting_reason = why.get(j.job_id, j.waiting_reason)

    async def job_stats(self, p: JobStats) -> JobStatsResult:
        """Counts by status and priority, finished jobs per bucket, the feed's head.

        Raises: BadRequest (window or bucket not positive, too many buckets).
        """
        if not (p.window_s > 0 and p.bucket_s > 0 and math.isfinite(p.window_s)
                and math.isfinite(p.bucket_s)):
            raise errors.BadRequest("window_s and bucket_s must be finite and > 0")
        ratio = p.window_s / p.bucket_s  # inf for a subnormal bucket
        if not ratio <= BUCKETS_MAX:
            raise errors.BadRequest(f"window_s / bucket_s must be at most {BUCKETS_MAX}")
        n = math.ceil(ratio)
        now = self._wall()
        # whole buckets on the epoch's grid, so a refresh never moves a job between them
        start = (math.floor(now / p.bucket_s) - (n - 1)) * p.bucket_s
        counts = {s: [0, 0, 0, 0] for s in JOB_STATUSES}
        for status, prio, k in await self._store.job_counts():
            counts.setdefault(status, [0, 0, 0, 0])[prio] += k
        rows, scanned = await self._store.end_rates(start, p.bucket_s)
        ended = {s: [0] * n for s in ("succeeded", "failed", "cancelled", "skipped")}
        for b, status, k in rows:
            if 0 <= b < n and status in ended:
                ended[status][b] += k
        return JobStatsResult(now=now, counts=counts,
                              bucket_starts=[start + i * p.bucket_s for i in range(n)],
                              events_scanned=scanned, **ended,
                              head_event_id=await self._store.last_event_id())

    async def fleet(self, p: NoParams | None = None) -> FleetResult:
        """Live leases, reservations and each worker's recent readings."""
        now = self._wall()
        return FleetResult(now=now, held=await self._store.held_leases(),
                           reservations=await self._store.live_reservations(),
                           readings=self.readings.snapshot(),
                           head_event_id=await self._store.last_event_id())

    async def feed_head(self, p: NoParams | None = None) -> FeedHead:
        """The event feed's newest event id (0 when there is none)."""
        return FeedHead(event_id=await self._store.last_event_id())

    async def workflow_runs(self, p: WorkflowRef) -> WorkflowRuns:
        """Every attempt of the workflow's nodes: from each claim to the event that ended
        it (None while it runs). Raises: BadRequest (empty id)."""
        check_name("workflow_id", p.workflow_id)
        runs: list[NodeRun] = []
        open_runs: dict[str, NodeRun] = {}
        for node, job_id, at, worker_id, from_status, to_status in \
                await self._store.workflow_events(p.workflow_id):
            run = open_runs.get(job_id)
            if run is not None and from_status == "running" and to_status != "running":
                run.end, run.outcome = at, to_status
                del open_runs[job_id]
            if to_status == "running" and from_status != "running":
                run = NodeRun(node=node or job_id, job_id=job_id, worker_id=worker_id,
                              start=at)
                runs.append(run)
                open_runs[job_id] = run
        return WorkflowRuns(runs=runs)

    async def message_log(self, p: MessageLog) -> MessageLogResult:
        """Hub messages newest first, with each reader's delivery state.

        Raises: BadRequest (limit outside 1..FIND_LIMIT_MAX), NotFound (`before` names no
        message).
        """
        if not 1 <= p.limit <= FIND_LIMIT_MAX:
            raise errors.BadRequest(f"limit must be 1..{FIND_LIMIT_MAX}, got {p.limit}")
        out = await self._store.message_page(p.before, p.limit)
        nxt = out[-1].message_id if len(out) == p.limit else None
        return MessageLogResult(messages=out, next_before=nxt)
