"""The web view's reads on PostgreSQL (coordd.store.api_web.WebReads): coordd.store.web's
statements on PostgreSQL's terms.

Where SQLite pages by rowid, PostgreSQL pages by job id (time-ordered, made at enqueue:
the same order) and, with a status, by (updated_at, job_id). `text` folds ASCII letters
only (translate), as SQLite's lower() does. Counts are read from `jobs` (SQLite keeps
counters by trigger); id prefixes compare by code point (COLLATE "C"), as SQLite does.
"""

from __future__ import annotations

from typing import Any

from coordd import errors
from coordd.wire.web import HeldLease, JobRow, LoggedMessage, Reservation
from coordd.store.api_web import (
    JobFinder, PrefixOf, PrefixResolve, held_lease, job_row, logged_messages, reservation,
)
from coordd.store.postgres.sql import NOW
from coordd.store.reads import JOB_BLOBS
from coordd.store.web import EVENTS_SCAN_MAX
from coordd.store.views import LISTED_JOB_BYTES

_UPPER, _LOWER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz"
_ROW_COLUMNS = (
    "j.job_id, j.kind, j.required_role, j.priority, j.status, j.attempts, j.max_attempts, "
    "j.created_at, j.updated_at, j.run_at, j.last_error, l.worker_id, l.expires_at, "
    "j.workflow_id, j.node"
)
_FILTERS = (  # $1 status .. $7 text (coordd.store.web._FILTERS)
    "($1::text IS NULL OR j.status = $1) AND ($2::text IS NULL OR j.kind = $2) "
    "AND ($3::text IS NULL OR j.required_role = $3) AND ($4::int IS NULL OR j.priority = $4) "
    "AND ($5::text IS NULL OR EXISTS (SELECT 1 FROM job_events e WHERE e.job_id = j.job_id "
    "AND e.worker_id = $5)) AND ($6::text IS NULL OR j.workflow_id = $6) "
    f"AND ($7::text IS NULL OR strpos(translate(j.payload_json, '{_UPPER}', '{_LOWER}'), $7) > 0 "
    f"OR strpos(translate(coalesce(j.last_error, ''), '{_UPPER}', '{_LOWER}'), $7) > 0)"
)
# $8 the cursor's job id (NULL: from the newest), $9 scan, $10 cap, $11 its updated_at
_AFTER = "($8::text IS NULL OR job_id < $8)"
SQL_MATCHES = (
    "SELECT j.job_id FROM (SELECT job_id FROM jobs WHERE " + _AFTER + " ORDER BY job_id DESC "
    "LIMIT $9) w JOIN jobs j ON j.job_id = w.job_id WHERE " + _FILTERS +
    " ORDER BY j.job_id DESC LIMIT $10"
)
_STATUS_AFTER = "($11::float8 IS NULL OR (updated_at, job_id) < ($11, $8))"
SQL_STATUS_MATCHES = (
    "SELECT j.job_id FROM (SELECT job_id, updated_at AS u FROM jobs WHERE status = $1 AND "
    + _STATUS_AFTER + " ORDER BY updated_at DESC, job_id DESC LIMIT $9) w "
    "JOIN jobs j ON j.job_id = w.job_id WHERE " + _FILTERS +
    " ORDER BY w.u DESC, j.job_id DESC LIMIT $10"
)
SQL_WORKFLOW_MATCHES = (
    "SELECT j.job_id FROM jobs j WHERE j.workflow_id = $6 AND " + _FILTERS +
    " AND ($8::text IS NULL OR j.job_id < $8) AND $9::int > 0 ORDER BY j.job_id DESC LIMIT $10"
)
SQL_CURSOR_OF = "SELECT updated_at FROM jobs WHERE job_id = $1"
SQL_ROWS = (f"SELECT {_ROW_COLUMNS} FROM jobs j LEFT JOIN leases l ON l.job_id = j.job_id "
            "WHERE j.job_id = ANY($1::text[])")
SQL_WINDOW_END = ("SELECT job_id FROM jobs WHERE ($1::text IS NULL OR job_id < $1) "
                  "ORDER BY job_id DESC LIMIT 1 OFFSET $2")
SQL_STATUS_WINDOW_END = (
    "SELECT job_id FROM jobs WHERE status = $1 AND ($2::float8 IS NULL OR "
    "(updated_at, job_id) < ($2, $3)) ORDER BY updated_at DESC, job_id DESC LIMIT 1 OFFSET $4"
)
SQL_COUNTS = "SELECT status, priority, count(*)::int FROM jobs GROUP BY status, priority"
SQL_RATES = (  # $1 since, $2 bucket_s, $3 events looked at (coordd.store.web.SQL_RATES)
    "SELECT floor((e.at - $1) / $2)::int, e.to_status, count(*)::int FROM "
    "(SELECT event_id, job_id, at, to_status FROM job_events ORDER BY event_id DESC "
    "LIMIT $3) e WHERE e.at >= $1 "
    "AND e.to_status IN ('succeeded', 'failed', 'cancelled', 'skipped') "
    "AND NOT EXISTS (SELECT 1 FROM job_events r WHERE r.job_id = e.job_id "
    "AND r.event_id > e.event_id AND r.from_status = e.to_status) GROUP BY 1, 2"
)
SQL_RATES_SCANNED = (
    "SELECT count(*)::int FROM (SELECT at FROM job_events ORDER BY event_id DESC LIMIT $2) x "
    "WHERE at >= $1"
)
SQL_HELD = (
    "SELECT l.worker_id, l.job_id, j.kind, j.priority, l.granted_at, l.expires_at "
    "FROM leases l JOIN jobs j ON j.job_id = l.job_id "
    "ORDER BY l.worker_id COLLATE \"C\", l.expires_at"
)
SQL_RESERVATIONS = (
    "SELECT worker_id, job_id, victim_job_id, expires_at FROM reservations "
    f"WHERE expires_at > {NOW} ORDER BY worker_id COLLATE \"C\""
)
SQL_WORKFLOW_EVENTS = (
    "SELECT j.node, e.job_id, e.at, e.worker_id, e.from_status, e.to_status "
    "FROM jobs j JOIN job_events e ON e.job_id = j.job_id "
    "WHERE j.workflow_id = $1 ORDER BY e.event_id"
)
SQL_MESSAGE_SEQ = "SELECT seq FROM messages WHERE message_id = $1"
SQL_MESSAGES = (  # $1 the `before` message's seq (NULL: from the newest), $2 limit
    "SELECT message_id, sender, recipient, message_type, priority, status, created_at, "
    "processed_at, expires_at, substr(content, 1, 200) FROM messages "
    "WHERE ($1::bigint IS NULL OR seq < $1) ORDER BY seq DESC LIMIT $2"
)
SQL_DELIVERIES = (
    "SELECT message_id, reader, deliveries, delivered_at, visible_at, processed_at "
    "FROM message_reads WHERE message_id = ANY($1::text[]) ORDER BY delivered_at"
)
PREFIX_SQL = {  # ($1 exact id), ($1 prefix, $2 most)
    "job": ("SELECT 1 FROM jobs WHERE job_id = $1",
            "SELECT job_id FROM jobs WHERE starts_with(job_id COLLATE \"C\", $1) "
            "ORDER BY job_id COLLATE \"C\" LIMIT $2"),
    "workflow": ("SELECT 1 FROM workflows WHERE workflow_id = $1",
                 "SELECT workflow_id FROM workflows WHERE starts_with(workflow_id "
                 "COLLATE \"C\", $1) ORDER BY workflow_id COLLATE \"C\" LIMIT $2"),
}

_BLOBS = " + ".join(f"coalesce(octet_length(j.{c}), 0)" for c in JOB_BLOBS)
SQL_JOB_BYTES = f"SELECT {_BLOBS} FROM jobs j WHERE j.job_id = $1"
_PAGE = (  # list_jobs' page ($1..$4 filters, $5 after, $6 limit): sizes, not the values
    f"SELECT {LISTED_JOB_BYTES} + {_BLOBS} AS n, j.job_id FROM jobs j "
    "WHERE ($1::text IS NULL OR j.status = $1) AND ($2::text IS NULL OR j.kind = $2) "
    "AND ($3::text IS NULL OR j.required_role = $3) AND ($4::int IS NULL OR j.priority = $4) "
)
SQL_PAGE_BYTES = ("SELECT coalesce(sum(n), 0) FROM (" + _PAGE
                  + "AND ($5::text IS NULL OR j.job_id > $5) ORDER BY j.job_id LIMIT $6) p")
SQL_PAGE_BYTES_NEWEST = ("SELECT coalesce(sum(n), 0) FROM (" + _PAGE
                         + "AND ($5::text IS NULL OR j.job_id < $5) "
                         "ORDER BY j.job_id DESC LIMIT $6) p")
SQL_JOB_EXISTS = "SELECT 1 FROM jobs WHERE job_id = $1"


class WebReadsPostgres(PrefixResolve):
    """WebReads over PostgresStore's pool (`self._conn()`); see the module docstring."""

    _conn: Any

    async def find_job_rows(self, flt: JobFinder, before: str | None, scan: int, cap: int,
                            limit: int) -> tuple[list[JobRow], int]:
        """The cursor, the matches and the page's rows in one snapshot."""
        async with self._conn() as conn, conn.transaction(isolation="repeatable_read",
                                                          readonly=True):
            updated = None
            if before is not None:
                updated = await conn.fetchval(SQL_CURSOR_OF, before)
                if updated is None:
                    raise errors.NotFound(f"job {before} not found (the page's `before`)")
            args = (*flt.args(), before, scan, cap)
            if flt.workflow_id is not None:
                found = await conn.fetch(SQL_WORKFLOW_MATCHES, *args)
            elif flt.status is not None:
                found = await conn.fetch(SQL_STATUS_MATCHES, *args, updated)
            else:
                found = await conn.fetch(SQL_MATCHES, *args)
            page = [r[0] for r in found[:limit]]
            got = {r[0]: r for r in await conn.fetch(SQL_ROWS, page)} if page else {}
        return [job_row(got[j]) for j in page if j in got], len(found)

    async def find_window_end(self, status: str | None, before: str | None,
                              scan: int) -> str | None:
        async with self._conn() as conn:
            async def at(job_id: str | None, offset: int) -> str | None:
                if status is None:
                    return await conn.fetchval(SQL_WINDOW_END, job_id, offset)
                updated = None if job_id is None else await conn.fetchval(SQL_CURSOR_OF,
                                                                          job_id)
                return await conn.fetchval(SQL_STATUS_WINDOW_END, status, updated, job_id,
                                           offset)
            end = await at(before, scan - 1)
            return end if end is not None and await at(end, 0) is not None else None

    async def job_counts(self) -> list[tuple[str, int, int]]:
        async with self._conn() as conn:
            return [tuple(r) for r in await conn.fetch(SQL_COUNTS)]

    async def end_rates(self, since: float, bucket_s: float
                        ) -> tuple[list[tuple[int, str, int]], int]:
        async with self._conn() as conn, conn.transaction(isolation="repeatable_read",
                                                          readonly=True):
            rows = await conn.fetch(SQL_RATES, since, bucket_s, EVENTS_SCAN_MAX)
            scanned = await conn.fetchval(SQL_RATES_SCANNED, since, EVENTS_SCAN_MAX)
        return [tuple(r) for r in rows], scanned

    async def held_leases(self) -> list[HeldLease]:
        async with self._conn() as conn:
            return [held_lease(r) for r in await conn.fetch(SQL_HELD)]

    async def live_reservations(self, *, now: float | None = None) -> list[Reservation]:
        async with self._conn() as conn:
            return [reservation(r) for r in await conn.fetch(SQL_RESERVATIONS, now)]

    async def workflow_events(self, workflow_id: str) -> list[tuple[Any, ...]]:
        async with self._conn() as conn:
            return [tuple(r) for r in await conn.fetch(SQL_WORKFLOW_EVENTS, workflow_id)]

    async def message_page(self, before: str | None, limit: int) -> list[LoggedMessage]:
        async with self._conn() as conn, conn.transaction(isolation="repeatable_read",
                                                          readonly=True):
            seq = None
            if before is not None:
                seq = await conn.fetchval(SQL_MESSAGE_SEQ, before)
                if seq is None:
                    raise errors.NotFound(f"message {before} not found (the page's `before`)")
            rows = await conn.fetch(SQL_MESSAGES, seq, limit)
            deliveries = await conn.fetch(SQL_DELIVERIES, [r[0] for r in rows])
        return logged_messages(rows, deliveries)

    async def id_prefix_matches(self, what: PrefixOf, given: str, most: int) -> list[str]:
        exact, starting = PREFIX_SQL[what]
        async with self._conn() as conn:
            if await conn.fetchval(exact, given) is not None:
                return [given]
            return [r[0] for r in await conn.fetch(starting, given, most)]

    async def job_reply_bytes(self, job_id: str) -> int:
        """octet_length of a TOASTed value reads its header, not the value."""
        async with self._conn() as conn:
            return await conn.fetchval(SQL_JOB_BYTES, job_id) or 0

    async def page_reply_bytes(self, flt: Any) -> int:
        stmt = SQL_PAGE_BYTES_NEWEST if flt.newest_first else SQL_PAGE_BYTES
        async with self._conn() as conn:
            if flt.after is not None and await conn.fetchval(SQL_JOB_EXISTS,
                                                             flt.after) is None:
                return 0
            return int(await conn.fetchval(stmt, flt.status, flt.kind, flt.role,
                                           flt.priority, flt.after, flt.limit))
