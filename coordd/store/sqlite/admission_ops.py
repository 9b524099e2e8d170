"""SQLiteStore's admission part (coordd.store.api_admission): thin adapters over the
functions the SQLite Coordinator runs (coordd.store.sqlite.leases, coordd.store.limits,
coordd.service.limits), on the same writer and readers."""

from __future__ import annotations

from typing import Any

from coordd.store.sqlite import leases
from coordd.rules.claim_batch import NextClaim
from coordd.rules.limits import LimitBook
from coordd.store.sqlite.claims import with_next
from coordd.wire.protocol import CompleteResult
from coordd.wire.limits import LimitView
from coordd.store import limits as limit_store
from coordd.store.api import Backoff, LeaseRef


class SQLiteAdmission:
    """Mixed into SQLiteStore (uses its `_write`, `_now` and `readers`)."""

    _write: Any
    _now: Any
    readers: Any

    async def complete_counted(self, ref: LeaseRef, result_json: str | None,
                               usage: dict[str, float] | None, book: LimitBook,
                               backoff: Backoff, *, artifact: Any = None,
                               now: float | None = None,
                               then: NextClaim | None = None) -> CompleteResult:
        def op(conn: Any, t: float) -> CompleteResult:
            res = leases.complete(conn, t, ref.job_id, ref.worker_id, ref.token, result_json,
                                  artifact, backoff)
            if usage and book.active:
                limit_store.record_usage(conn, t, ref.job_id, usage, book)
            return res
        return await self._write(with_next(op, then), now, urgent=True)

    async def limits_loaded(self, book: LimitBook) -> None:
        """The book is installed: the `limit_holds_release` trigger is dropped while no
        limit is defined nor unit held (coordd.store.limits.settle_release_trigger)."""
        await self._write(lambda conn, t: limit_store.settle_release_trigger(
            conn, t, active=book.active), None, urgent=True)

    async def limit_overrides(self) -> list[tuple[str, dict[str, Any]]]:
        return await self.readers.run(limit_store.overrides)

    async def set_limit_override(self, name: str, settings: dict[str, Any] | None,
                                 rate_dropped: bool, *, now: float | None = None) -> None:
        await self._write(lambda conn, t: limit_store.set_override(
            conn, t, name, settings, rate_dropped), now)

    async def job_limits(self, job_id: str, priority: int, waiting: bool, book: LimitBook,
                         *, now: float | None = None) -> tuple[list[tuple[str, int]], str | None]:
        return await self.readers.run(limit_store.read_annotation, self._now(now), book, job_id,
                                      priority, waiting and book.active)

    async def limit_views(self, book: LimitBook, names: list[str], holders: bool, *,
                          now: float | None = None) -> tuple[list[LimitView], float]:
        t = self._now(now)
        return await self.readers.run(limit_store.read_views, t, book, names, holders), t

    async def limit_reasons(self, waiting: list[tuple[str, int]], book: LimitBook, *,
                            now: float | None = None) -> dict[str, str]:
        if not waiting or not book.active:
            return {}
        return await self.readers.run(limit_store.limit_reasons, self._now(now), book,
                                      waiting)
