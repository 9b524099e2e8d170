"""The store interface's reads for the parked calls (coordd.store.api's `Store`, this
area apart): what `wait_job`, `watch_worker` and `watch_events` look at each time they
are woken. The parking itself (coordd.service.push: register, then look; the wake-ups) and the
checks of cursors, limits, waits and the event filter stay above the store.

Callers: coordd.service.waits.Waits.watch_worker (`worker_actions`), Waits.watch_events
(`feed`, `last_event_id`; `wait_job` looks with the Coordinator's `get_job`, the view it
answers with; `job_status` is there for a cheaper look; `scheduled_jobs`: the timers of
jobs not yet due), coordd.service.push.Push.claim (`claims_parked`).
"""

from __future__ import annotations

from typing import Any, Protocol

from coordd.wire.push import FeedEvent, WorkerActions


def actions(cancel: list[str], governed: list[tuple[str, bool, str | None]]) -> WorkerActions:
    """WorkerActions of a worker's cancels and governed leases (job_id, vacate?, reason)."""
    acts = WorkerActions(cancel=cancel)
    for job_id, vacate, reason in governed:
        (acts.vacate if vacate else acts.suspend).append(job_id)
        acts.reasons[job_id] = reason or ""
    return acts


def feed_event(row: Any) -> FeedEvent:
    """A FeedEvent of a coordd.store.push.SQL_FEED row (the same columns on PostgreSQL)."""
    return FeedEvent(event_id=row[0], job_id=row[1], at=row[2], worker_id=row[3],
                     from_status=row[4], to_status=row[5], reason=row[6], kind=row[7],
                     workflow_id=row[8], node=row[9])


class WaitReads(Protocol):
    """The parked calls' reads over one database. `now` as in coordd.store.api."""

    async def job_status(self, job_id: str) -> str | None:
        """The job's status, None when there is no such job."""
        ...

    async def worker_actions(self, worker_id: str) -> WorkerActions:
        """What coordd asks of the jobs `worker_id` holds, each list in job id order:
        `cancel` (a cancel was requested), `suspend` / `vacate` (coordd's governance state
        of the lease) with `reasons` (job id -> the suspend or vacate reason, "" when
        none); `resume` stays empty (a heartbeat's reply carries it)."""
        ...

    async def feed(self, after: int, scan: int, *,
                   now: float | None = None) -> list[FeedEvent]:
        """Up to `scan` job events with id > `after`, in id order, each with its job's kind,
        workflow and node (None once the job is pruned). Every event returned is final:
        a reader resuming after the last one never misses one committed later (SQLite:
        one writer; PostgreSQL: the feed stops before an id not yet committed, see
        coordd.store.postgres.waits). The filter is the caller's."""
        ...

    async def last_event_id(self) -> int:
        """The highest event id (0 when there is none)."""
        ...

    async def want_wakeups(self, what: str, for_s: float) -> None:
        """Make sure wake-ups of `what` ("t": jobs ending, `wait_job`; "e": new events,
        `watch_events`) are sent for at least `for_s` seconds from now; returns once that
        is committed, before the parked call's first look. SQLite: nothing to do (the
        writer notes every commit in process)."""
        ...

    async def scheduled_jobs(self, *, now: float | None = None
                             ) -> list[tuple[float, str, str]]:
        """(run_at, role, kind) of every waiting job not yet due at `now` (Unix seconds)."""
        ...

    def claims_parked(self, on: bool) -> None:
        """Whether any claim is parked (or looking) now: told when the first one parks
        and when the last one leaves, from the event loop, never inside a write. A store
        may note heartbeats and freed limit units only meanwhile (SQLite); it must not
        block and never raises."""
        ...


__all__ = ["WaitReads", "actions", "feed_event"]
