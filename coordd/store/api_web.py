"""The store interface's reads for the web view and the id prefixes (coordd.store.api's
`Store`, this area apart): filtered job pages, counts and end rates, live leases and
reservations, a workflow's events, the hub's message log, ids by prefix.

Callers: coordd.service.web_reads.WebReads.find_jobs (`find_job_rows`,
`find_window_end`, `job_counts`; the waiting reasons stay above), job_stats
(`job_counts`, `end_rates`, api_waits' `last_event_id`), fleet (`held_leases`,
`live_reservations`, `last_event_id`), feed_head (`last_event_id`), workflow_runs
(`workflow_events`; the runs are built above), message_log (`message_page`); the
Coordinator's get_job and workflow_get with `prefix` (`resolve_id`: `id_prefix_matches`,
then coordd.store.views.pick_prefix decides). The checks of filters, limits and windows stay above.

Order: a page is newest first by enqueue order (SQLite: rowid; PostgreSQL: job id, which
is time-ordered and made at enqueue), with a status by last change; every read is
bounded by `scan` (a window) or `limit`.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import msgspec

from coordd import errors
from coordd.wire.web import Delivery, HeldLease, JobRow, LoggedMessage, Reservation
from coordd.store.views import PREFIX_MATCHES_SHOWN, pick_prefix

PrefixOf = Literal["job", "workflow"]


class JobFinder(msgspec.Struct, frozen=True, kw_only=True):
    """find_jobs' filters, checked (coordd.service.web_reads): every given one must match.
    `text`: a substring of the payload or the last error, ASCII letters lower-cased by
    the caller (the stores fold ASCII only, as SQLite's lower())."""

    status: str | None = None
    kind: str | None = None
    role: str | None = None
    priority: int | None = None
    worker: str | None = None
    workflow_id: str | None = None
    text: str | None = None

    def args(self) -> tuple[Any, ...]:
        """The filters in statement order ($1..$7 / ?1..?7)."""
        return (self.status, self.kind, self.role, self.priority, self.worker,
                self.workflow_id, self.text)


def job_row(r: Any) -> JobRow:
    """A JobRow of coordd.store.web's row columns (the same on PostgreSQL)."""
    return JobRow(job_id=r[0], kind=r[1], required_role=r[2], priority=r[3], status=r[4],
                  attempts=r[5], max_attempts=r[6], created_at=r[7], updated_at=r[8],
                  run_at=r[9], last_error=r[10], worker_id=r[11], lease_expires_at=r[12],
                  workflow_id=r[13], node=r[14])


def held_lease(r: Any) -> HeldLease:
    return HeldLease(worker_id=r[0], job_id=r[1], kind=r[2], priority=r[3], granted_at=r[4],
                     expires_at=r[5])


def reservation(r: Any) -> Reservation:
    return Reservation(worker_id=r[0], job_id=r[1], victim_job_id=r[2], expires_at=r[3])


def logged_messages(rows: list[Any], deliveries: list[Any]) -> list[LoggedMessage]:
    """Messages (coordd.store.web.SQL_MESSAGES' columns) with their readers' delivery
    rows (SQL_DELIVERIES'), in the rows' order."""
    by_id: dict[str, list[Delivery]] = {}
    for mid, reader, n, at, visible, done in deliveries:
        by_id.setdefault(mid, []).append(Delivery(reader=reader, deliveries=n, delivered_at=at,
                                                  visible_at=visible, processed_at=done))
    return [LoggedMessage(message_id=r[0], sender=r[1], recipient=r[2], message_type=r[3],
                          priority=r[4], status=r[5], created_at=r[6], processed_at=r[7],
                          expires_at=r[8], preview=r[9] or "", deliveries=by_id.get(r[0], []))
            for r in rows]


class WebReads(Protocol):
    """The web view's reads over one database (see the module docstring). `now` as in
    coordd.store.api."""

    async def find_job_rows(self, flt: JobFinder, before: str | None, scan: int, cap: int,
                            limit: int) -> tuple[list[JobRow], int]:
        """Up to `cap` jobs matching `flt` in one pass over a window of `scan` jobs after
        the job `before` (with a status: that status's jobs by last change; with a
        workflow: its jobs, no window); the rows of the first `limit` of them, newest
        first, and how many matched (up to `cap`). Raises: errors.NotFound (`before`)."""
        ...

    async def find_window_end(self, status: str | None, before: str | None,
                              scan: int) -> str | None:
        """The job id where a window of `scan` jobs after `before` stops; None when it
        reaches the oldest job (no further page)."""
        ...

    async def job_counts(self) -> list[tuple[str, int, int]]:
        """(status, priority, n) of every job, zero counts possibly left out."""
        ...

    async def end_rates(self, since: float, bucket_s: float
                        ) -> tuple[list[tuple[int, str, int]], int]:
        """((bucket index from `since` in `bucket_s` steps, terminal status, jobs) of the
        jobs that ended since `since`, each at its last terminal event, among the newest
        coordd.store.web.EVENTS_SCAN_MAX events; how many of those are since `since`)."""
        ...

    async def held_leases(self) -> list[HeldLease]:
        """Every lease, by worker then expiry."""
        ...

    async def live_reservations(self, *, now: float | None = None) -> list[Reservation]:
        """Preemption's reservations not expired at `now`, by worker."""
        ...

    async def workflow_events(self, workflow_id: str) -> list[tuple[Any, ...]]:
        """(node, job_id, at, worker_id, from_status, to_status) of every event of the
        workflow's jobs, in event order."""
        ...

    async def message_page(self, before: str | None, limit: int) -> list[LoggedMessage]:
        """Up to `limit` hub messages sent before the message `before`, newest first,
        previews of 200 characters, with their deliveries.
        Raises: errors.NotFound (`before`)."""
        ...

    async def id_prefix_matches(self, what: PrefixOf, given: str, most: int) -> list[str]:
        """[given] when a job (workflow) has this id, else up to `most` ids that start
        with it, in id order."""
        ...

    async def job_reply_bytes(self, job_id: str) -> int:
        """The bytes of stored JSON (payload, result, checkpoint, gates, last error) the
        job's view carries, known before its row is read (0: no such job): what
        coordd.net.budgets reserves before `get_job` reads it."""
        ...

    async def page_reply_bytes(self, flt: Any) -> int:
        """The bytes the `list_jobs` page of `flt` (a coordd.store.api.JobFilter) will
        carry: per job coordd.store.views.LISTED_JOB_BYTES plus its JSON as `job_reply_bytes`;
        an `after` that names no job sizes as an empty page."""
        ...


class PrefixResolve:
    """`Store.resolve_id` for both stores (a mixin over `id_prefix_matches`): the match
    is the store's, the verdict coordd.store.views.pick_prefix's."""

    id_prefix_matches: Any

    async def resolve_id(self, what: PrefixOf, given: str) -> str:
        """The job or workflow id `given` is, or the one it is the start of.
        Raises: NotFound, BadRequest (empty, ambiguous: a few matches are named)."""
        if not given:
            raise errors.BadRequest(f"{what}_id must not be empty")
        ids = await self.id_prefix_matches(what, given, PREFIX_MATCHES_SHOWN + 1)
        return pick_prefix(what, given, ids)


__all__ = ["JobFinder", "PrefixOf", "PrefixResolve", "WebReads", "held_lease", "job_row",
           "logged_messages", "reservation"]
