"""The web view's reads on SQLite (coordd.store.api_web.WebReads): coordd.store.web's
functions on the read pool."""

from __future__ import annotations

from typing import Any

from coordd import errors
from coordd.store import views
from coordd.wire.web import HeldLease, JobRow, LoggedMessage, Reservation
from coordd.store import reads
from coordd.store import web as web_store
from coordd.store import workflow_reads as wreads
from coordd.store.api_web import (
    JobFinder, PrefixOf, PrefixResolve, held_lease, job_row, logged_messages, reservation,
)

PREFIX_SQL = {"job": (reads.SQL_JOB_EXISTS, reads.SQL_JOB_IDS_FROM),
              "workflow": (wreads.SQL_WORKFLOW_EXISTS, wreads.SQL_WORKFLOW_IDS_FROM)}


def _find(conn: Any, flt: JobFinder, before: str | None, scan: int, cap: int,
          limit: int) -> tuple[list[JobRow], int]:
    cursor = None
    if before is not None:
        cursor = web_store.cursor_of(conn, before)
        if cursor is None:
            raise errors.NotFound(f"job {before} not found (the page's `before`)")
    found = web_store.matches(conn, flt.args(), cursor, scan, cap)
    page = found[:limit]
    return [job_row(r) for r in (web_store.rows(conn, page) if page else [])], len(found)


def _window_end(conn: Any, status: str | None, before: str | None, scan: int) -> str | None:
    cursor = None if before is None else web_store.cursor_of(conn, before)
    return web_store.window_end(conn, status, cursor, scan)


def _messages(conn: Any, before: str | None, limit: int) -> list[LoggedMessage]:
    if before is not None and not web_store.message_exists(conn, before):
        raise errors.NotFound(f"message {before} not found (the page's `before`)")
    return logged_messages(*web_store.messages(conn, before, limit))


class SQLiteWebReads(PrefixResolve):
    """WebReads on the read pool (a mixin: SQLiteStore has `readers` and `_now`)."""

    readers: Any
    _now: Any

    async def find_job_rows(self, flt: JobFinder, before: str | None, scan: int, cap: int,
                            limit: int) -> tuple[list[JobRow], int]:
        """The cursor, the matches and the page's rows on one read connection."""
        return await self.readers.run(_find, flt, before, scan, cap, limit)

    async def find_window_end(self, status: str | None, before: str | None,
                              scan: int) -> str | None:
        return await self.readers.run(_window_end, status, before, scan)

    async def job_counts(self) -> list[tuple[str, int, int]]:
        """From the counters the writer's triggers keep."""
        return [tuple(r) for r in await self.readers.run(web_store.counts)]

    async def end_rates(self, since: float, bucket_s: float
                        ) -> tuple[list[tuple[int, str, int]], int]:
        rows, scanned = await self.readers.run(web_store.rates, since, bucket_s)
        return [tuple(r) for r in rows], scanned

    async def held_leases(self) -> list[HeldLease]:
        return [held_lease(r) for r in await self.readers.run(web_store.held)]

    async def live_reservations(self, *, now: float | None = None) -> list[Reservation]:
        return [reservation(r) for r in await self.readers.run(web_store.reservations,
                                                                self._now(now))]

    async def workflow_events(self, workflow_id: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in await self.readers.run(web_store.workflow_events,
                                                          workflow_id)]

    async def message_page(self, before: str | None, limit: int) -> list[LoggedMessage]:
        return await self.readers.run(_messages, before, limit)

    async def id_prefix_matches(self, what: PrefixOf, given: str, most: int) -> list[str]:
        return await self.readers.run(views.prefix_matches, given, *PREFIX_SQL[what], most)

    async def job_reply_bytes(self, job_id: str) -> int:
        """From the record header and blob handles: the values are not read."""
        return await self.readers.run(views.job_bytes, job_id)

    async def page_reply_bytes(self, flt: Any) -> int:
        return await self.readers.run(
            lambda conn: views.page_bytes(
                conn, status=flt.status, kind=flt.kind, role=flt.role, priority=flt.priority,
                limit=flt.limit, after=flt.after, newest_first=flt.newest_first), heavy=True)
