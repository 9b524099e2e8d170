"""The parked calls' reads on SQLite (coordd.store.api_waits.WaitReads): coordd.store.push's
functions on the read pool."""

from __future__ import annotations

from typing import Any

from coordd.wire.push import FeedEvent, WorkerActions
from coordd.store import push as push_store
from coordd.store.api_waits import actions, feed_event


class SQLiteWaitReads:
    """WaitReads on the read pool (a mixin: SQLiteStore has `readers` and `_now`)."""

    readers: Any
    _now: Any

    async def job_status(self, job_id: str) -> str | None:
        return await self.readers.run(push_store.job_status, job_id)

    async def worker_actions(self, worker_id: str) -> WorkerActions:
        def read(conn: Any) -> WorkerActions:  # one connection, one snapshot
            return actions(push_store.cancel_for_worker(conn, worker_id),
                           push_store.governed_for_worker(conn, worker_id))
        return await self.readers.run(read)

    async def feed(self, after: int, scan: int, *,
                   now: float | None = None) -> list[FeedEvent]:
        """coordd.store.push.feed (the single writer commits events in id order)."""
        return [feed_event(r) for r in await self.readers.run(push_store.feed, after, scan)]

    async def last_event_id(self) -> int:
        return await self.readers.run(push_store.last_event)

    async def scheduled_jobs(self, *, now: float | None = None
                             ) -> list[tuple[float, str, str]]:
        return [tuple(r) for r in await self.readers.run(push_store.scheduled, self._now(now))]

    async def want_wakeups(self, what: str, for_s: float) -> None:
        """Nothing to do: the writer notes every commit in process."""
