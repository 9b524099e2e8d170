"""The server-side waits: `wait_job`, `watch_worker`, `watch_events` (issue 15).

Each looks on the read connection and, while there is nothing to answer, parks on
coordd.push until a commit concerns it or its time is up (coordd.push has the rule:
register, then look). Served as Coordinator methods on a SQLite store (coordd.service.local);
a claim's `wait_s` parks in the Coordinator's own `claim`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from coordd import errors
from coordd.names import check_name
from coordd.protocol import TERMINAL_STATUSES, JobId, JobView
from coordd.protocol_push import (
    EventsResult, FeedEvent, WaitJob, WaitJobResult, WatchEvents, WatchWorker, WorkerActions,
)
from coordd.push import Push
from coordd.store import push as push_store

TERMINAL = frozenset(TERMINAL_STATUSES)
FEED_SCAN = 1000       # events looked at per look of `watch_events`
FEED_LIMIT_MAX = 1000  # events one `watch_events` reply carries at most
FEED_CURSOR_MAX = (1 << 63) - 1  # event ids are SQLite rowids
FEED_SCANS_PER_LOOK = 8  # scans of FEED_SCAN a look makes before answering (a filter may match none)


class Waits:
    """`wait_job`, `watch_worker` and `watch_events` over one Coordinator's reads.

    Args:
        push: where the calls park.
        read: `await read(fn, *args)` runs `fn(conn, *args)` on the read connection.
        get_job: the Coordinator's `get_job` (the same view `wait_job` answers with).
    """

    def __init__(self, push: Push, read: Callable[..., Awaitable[Any]],
                 get_job: Callable[[JobId], Awaitable[JobView]]) -> None:
        self._push = push
        self._read = read
        self._get_job = get_job

    async def wait_job(self, p: WaitJob) -> WaitJobResult:
        """The job's view once it is terminal (at once if it is), else at `timeout_s`
        (cut to `park_wait_max_s`) with terminal False.

        Raises: NotFound, BadRequest (bad timeout), Overloaded (parked-call caps).
        """
        check_name("job_id", p.job_id)
        wait = self._push.wait_s(p.timeout_s, "timeout_s")

        async def look() -> tuple[bool, WaitJobResult]:
            job = await self._get_job(JobId(job_id=p.job_id))
            terminal = job.status in TERMINAL
            return terminal, WaitJobResult(job=job, terminal=terminal)

        if wait <= 0:
            return (await look())[1]
        return await self._push.wait_for("job", p.job_id, wait, look)

    async def watch_worker(self, p: WatchWorker) -> WorkerActions:
        """The actions for the jobs `worker_id` holds, as soon as one is not in `seen`,
        else at `wait_s`. Raises: BadRequest, Overloaded."""
        check_name("worker_id", p.worker_id)
        wait = self._push.wait_s(p.wait_s)
        seen = p.seen

        async def look() -> tuple[bool, WorkerActions]:
            acts = WorkerActions(cancel=await self._read(push_store.cancel_for_worker,
                                                         p.worker_id))
            for job_id, vacate, reason in await self._read(push_store.governed_for_worker,
                                                           p.worker_id):
                (acts.vacate if vacate else acts.suspend).append(job_id)
                acts.reasons[job_id] = reason or ""
            new = (set(acts.cancel) - set(seen.cancel) or set(acts.suspend) - set(seen.suspend)
                   or set(acts.resume) - set(seen.resume) or set(acts.vacate) - set(seen.vacate))
            return bool(new), acts

        if wait <= 0:
            return (await look())[1]
        return await self._push.wait_for("worker", p.worker_id, wait, look)

    async def watch_events(self, p: WatchEvents) -> EventsResult:
        """Job events with id > `after` that pass `filter`, in id order (at most `limit`),
        parked up to `wait_s` while there are none. `next_after` is past every event
        looked at, so a reader that resumes from it misses nothing and sees nothing twice.
        A cursor past the newest event (one from another database: a restore, a new
        file) is answered at once with no events and `next_after` = the newest event's
        id, below `after`: the reader goes on from there.

        Raises: BadRequest (negative cursor, limit outside 1..1000, bad wait), Overloaded.
        """
        if not 0 <= p.after <= FEED_CURSOR_MAX:
            raise errors.BadRequest(f"after must be 0..{FEED_CURSOR_MAX}, got {p.after}")
        if not 1 <= p.limit <= FEED_LIMIT_MAX:
            raise errors.BadRequest(f"limit must be 1..{FEED_LIMIT_MAX}, got {p.limit}")
        wait = self._push.wait_s(p.wait_s)
        f = p.filter
        statuses = None if f.to_status is None else frozenset(f.to_status)
        cursor = p.after

        async def look() -> tuple[bool, EventsResult]:
            nonlocal cursor
            out: list[FeedEvent] = []
            full = False
            for _ in range(FEED_SCANS_PER_LOOK):
                rows = await self._read(push_store.feed, cursor, FEED_SCAN)
                for row in rows:
                    ev = FeedEvent(event_id=row[0], job_id=row[1], at=row[2],
                                   worker_id=row[3], from_status=row[4], to_status=row[5],
                                   reason=row[6], kind=row[7], workflow_id=row[8], node=row[9])
                    cursor = ev.event_id
                    if (f.job_id is None or ev.job_id == f.job_id) \
                            and (f.workflow_id is None or ev.workflow_id == f.workflow_id) \
                            and (f.kind is None or ev.kind == f.kind) \
                            and (statuses is None or ev.to_status in statuses):
                        out.append(ev)
                        if len(out) == p.limit:
                            break
                full = len(rows) == FEED_SCAN
                if not rows and cursor == p.after and cursor > 0:
                    head = await self._read(push_store.last_event)
                    if head < cursor:  # past the head: not this database's cursor
                        return True, EventsResult(events=[], next_after=head)
                if out or not full:
                    break
            # more left unscanned: answer now (perhaps with no event), the reader goes on
            return bool(out) or full, EventsResult(events=out, next_after=cursor)

        if wait <= 0:
            return (await look())[1]
        return await self._push.wait_for("events", None, wait, look)
