"""The parked calls' reads on PostgreSQL (coordd.store.api_waits.WaitReads).

The event feed's one rule beyond SQLite's: an event id is drawn when its row is inserted
but seen only once its transaction commits, so ids commit out of order (SQLite's single
writer commits them in order). A reader following by cursor must never step past an id
that may still commit: the feed stops before a gap in the ids (the first event after it
held back) unless the event after the gap is FEED_GAP_SETTLED_S old by the database's
clock. Such a gap is a rolled-back transaction or a pruned event, and stays; coordd's
transactions last milliseconds, far below that.
"""

from __future__ import annotations

from typing import Any

from coordd.clock import SystemClock
from coordd.wire.push import FeedEvent, WorkerActions
from coordd.store.postgres.sql import NOW
from coordd.store.api_waits import actions, feed_event
from coordd.store.postgres.push_sql import SQL_WANT, WANT_SLACK_S

_MONO = SystemClock()  # this store's own memory of its wake-ups: monotonic, not the DB's

FEED_GAP_SETTLED_S = 5.0  # a gap in event ids older than this is final (no commit to come)

SQL_JOB_STATUS = "SELECT status FROM jobs WHERE job_id = $1"
SQL_CANCEL_FOR_WORKER = (
    "SELECT l.job_id FROM leases l JOIN jobs j ON j.job_id = l.job_id "
    "WHERE l.worker_id = $1 AND j.cancel_requested ORDER BY l.job_id COLLATE \"C\""
)
SQL_GOVERNED_FOR_WORKER = (
    "SELECT job_id, vacate_reason IS NOT NULL, coalesce(vacate_reason, suspend_reason) "
    "FROM leases WHERE worker_id = $1 AND (suspended_at IS NOT NULL OR vacate_reason IS NOT "
    "NULL) ORDER BY job_id COLLATE \"C\""
)
SQL_FEED = (  # $2 after, $3 scan; the statement's NOW last
    "SELECT e.event_id, e.job_id, e.at, e.worker_id, e.from_status, e.to_status, e.reason, "
    f"j.kind, j.workflow_id, j.node, {NOW} FROM "
    "(SELECT * FROM job_events WHERE event_id > $2 ORDER BY event_id LIMIT $3) e "
    "LEFT JOIN jobs j ON j.job_id = e.job_id ORDER BY e.event_id"
)
SQL_LAST_EVENT = "SELECT coalesce(max(event_id), 0) FROM job_events"
SQL_SCHEDULED = (
    f"SELECT run_at, required_role, kind FROM jobs WHERE status = 'waiting' AND run_at > {NOW}"
)


def settled(rows: list[Any], after: int) -> list[Any]:
    """The rows up to the first gap in ids whose next event is younger than
    FEED_GAP_SETTLED_S (each row's last column is the statement's now)."""
    out, expected = [], after + 1
    for r in rows:
        if r[0] != expected and r[-1] - r[2] < FEED_GAP_SETTLED_S:
            break
        out.append(r)
        expected = r[0] + 1
    return out


class WaitReadsPostgres:
    """WaitReads over PostgresStore's pool (`self._conn()`); see the module docstring."""

    _conn: Any
    _wanted: dict[str, float]  # what -> monotonic time its wake-ups are known on until

    def claims_parked(self, on: bool) -> None:
        """Nothing to do: every NOTIFY and every poll wakes every parked claim
        (coordd.store.postgres.hooks), so no heartbeat or freed limit unit needs noting."""

    async def want_wakeups(self, what: str, for_s: float) -> None:
        """push_wanted's row ahead by `for_s` + WANT_SLACK_S on the database's clock;
        written only when the last write does not cover it (about once a minute)."""
        need = _MONO.mono() + for_s
        if self._wanted.get(what, 0.0) >= need:
            return
        ahead = for_s + WANT_SLACK_S
        async with self._conn() as conn:
            await conn.execute(SQL_WANT, what, ahead)
        self._wanted[what] = need + WANT_SLACK_S - 5.0  # 5 s for the round trip

    async def job_status(self, job_id: str) -> str | None:
        async with self._conn() as conn:
            return await conn.fetchval(SQL_JOB_STATUS, job_id)

    async def worker_actions(self, worker_id: str) -> WorkerActions:
        """Both reads in one snapshot (a repeatable-read transaction)."""
        async with self._conn() as conn, conn.transaction(isolation="repeatable_read",
                                                          readonly=True):
            cancel = [r[0] for r in await conn.fetch(SQL_CANCEL_FOR_WORKER, worker_id)]
            governed = [(r[0], bool(r[1]), r[2])
                        for r in await conn.fetch(SQL_GOVERNED_FOR_WORKER, worker_id)]
        return actions(cancel, governed)

    async def feed(self, after: int, scan: int, *,
                   now: float | None = None) -> list[FeedEvent]:
        """SQLite's feed, cut before an id that may still commit (`settled`)."""
        async with self._conn() as conn:
            rows = await conn.fetch(SQL_FEED, now, after, scan)
        return [feed_event(r) for r in settled(rows, after)]

    async def last_event_id(self) -> int:
        async with self._conn() as conn:
            return await conn.fetchval(SQL_LAST_EVENT)

    async def scheduled_jobs(self, *, now: float | None = None
                             ) -> list[tuple[float, str, str]]:
        async with self._conn() as conn:
            return [tuple(r) for r in await conn.fetch(SQL_SCHEDULED, now)]
