"""The server-side waits: `wait_job`, `watch_worker`, `watch_events` (issue 15).

Each looks through the store interface (coordd.store.api_waits) and, while there is
nothing to answer, parks on coordd.service.push until a commit concerns it or its time is up
(coordd.service.push has the rule: register, then look; the wake-ups come from the SQLite
writer's commits or PostgreSQL's NOTIFY). Served as Coordinator methods on both stores;
a claim's `wait_s` parks in the Coordinator's own `claim`.

An event feed that stops short of the newest event id (PostgreSQL: before a gap of ids
not yet committed, coordd.store.postgres.waits) looks again every GAP_LOOK_S while
parked: a gap that turns out final (a rollback) sends no wake-up.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from coordd import errors
from coordd.rules.names import check_name
from coordd.wire.protocol import TERMINAL_STATUSES, JobId, JobView
from coordd.wire.push import (
    FEED_CURSOR_MAX, EventsResult, FeedEvent, WaitJob, WaitJobResult, WatchEvents, WatchWorker,
    WorkerActions,
)
from coordd.service.push import Push

TERMINAL = frozenset(TERMINAL_STATUSES)
FEED_SCAN = 1000       # events looked at per look of `watch_events`
FEED_LIMIT_MAX = 1000  # events one `watch_events` reply carries at most
GAP_LOOK_S = 1.0       # a parked feed held back by a gap looks again this often
FEED_SCANS_PER_LOOK = 8  # scans of FEED_SCAN a look makes before answering (a filter may match none)


class Waits:
    """`wait_job`, `watch_worker` and `watch_events` over one store.

    Args:
        push: where the calls park.
        store: the Coordinator's store (coordd.store.api_waits.WaitReads).
        get_job: the Coordinator's `get_job` (the same view `wait_job` answers with).
    """

    def __init__(self, push: Push, store: Any,
                 get_job: Callable[[JobId], Awaitable[JobView]]) -> None:
        self._push = push
        self._store = store
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
        await self._store.want_wakeups("t", wait)  # before the first look
        return await self._push.wait_for("job", p.job_id, wait, look)

    async def watch_worker(self, p: WatchWorker) -> WorkerActions:
        """The actions for the jobs `worker_id` holds, as soon as one is not in `seen`,
        else at `wait_s`. Raises: BadRequest, Overloaded."""
        check_name("worker_id", p.worker_id)
        wait = self._push.wait_s(p.wait_s)
        seen = p.seen

        async def look() -> tuple[bool, WorkerActions]:
            acts: WorkerActions = await self._store.worker_actions(p.worker_id)
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

        async def look() -> tuple[bool, EventsResult, float | None]:
            nonlocal cursor
            out: list[FeedEvent] = []
            full = False
            for _ in range(FEED_SCANS_PER_LOOK):
                events = await self._store.feed(cursor, FEED_SCAN)
                for ev in events:
                    cursor = ev.event_id
                    if (f.job_id is None or ev.job_id == f.job_id) \
                            and (f.workflow_id is None or ev.workflow_id == f.workflow_id) \
                            and (f.kind is None or ev.kind == f.kind) \
                            and (statuses is None or ev.to_status in statuses):
                        out.append(ev)
                        if len(out) == p.limit:
                            break
                full = len(events) == FEED_SCAN
                if out or not full:
                    break
            if out or full:  # more left unscanned: answer now, the reader goes on
                return True, EventsResult(events=out, next_after=cursor), None
            head = await self._store.last_event_id()
            if head < cursor and cursor == p.after:  # not this database's cursor
                return True, EventsResult(events=[], next_after=head), None
            # events above the cursor the feed held back (a gap not settled): look again
            again = GAP_LOOK_S if head > cursor else None
            return False, EventsResult(events=out, next_after=cursor), again

        if wait <= 0:
            return (await look())[1]
        await self._store.want_wakeups("e", wait)  # before the first look
        return await self._push.wait_for("events", None, wait, look)
