"""Fleet-wide limits served over the store interface (coordd.store.api_admission): the
`limits`, `limits_set`, `limits_reset` methods of a StoreCoordinator, and its `complete`
with reported usage. The checks are the SQLite Coordinator's (coordd.limit_service,
coordd.limits.LimitBook); a runtime override is stored first and only then installed in
the LimitBook the claims read, as on SQLite.
"""

from __future__ import annotations

import logging
from typing import Any

from coordd import limit_service
from coordd.limit_service import LIMIT_METHODS, check_override, check_usage, names_asked
from coordd.protocol import Complete, CompleteResult
from coordd.protocol_limits import (
    LimitReset, LimitSet, LimitsQuery, LimitsResult, LimitUse, LimitView,
)
from coordd.store.api import LeaseRef

logger = logging.getLogger(__name__)

__all__ = ["LIMIT_METHODS", "StoreLimits"]


class StoreLimits:
    """Mixed into StoreCoordinator (uses its `store`, `limit_book`, `_backoff`, `_wake`)."""

    store: Any
    limit_book: Any
    _backoff: Any
    _wake: Any

    async def load_limits(self) -> None:
        """Install the runtime overrides stored in the database (at start)."""
        self.store.backoff_factory = self._backoff  # a result failing its schema waits
        for name, why in self.limit_book.load_overrides(await self.store.limit_overrides()):
            logger.warning("runtime override of limit %s ignored: %s", name, why,
                           extra={"action": "limit_override_ignored", "limit": name})

    async def limits(self, p: LimitsQuery | None = None) -> LimitsResult:
        """Every limit (or `p.name`) with its use now. Raises: NotFound (no such limit)."""
        p = p or LimitsQuery()
        views, now = await self.store.limit_views(self.limit_book,
                                                  names_asked(self.limit_book, p), p.holders)
        return LimitsResult(limits=views, now=now)

    async def limits_set(self, p: LimitSet) -> LimitView:
        """Change (or create) limit `p.name` at runtime, kept in the database (as on
        SQLite). Raises: errors.BadRequest (a bad key or value: nothing changes)."""
        override, limit = self.limit_book.preview(p.name, p.settings)
        old = self.limit_book.defs.get(p.name)
        dropped = bool(old is not None and old.rate_n and not limit.rate_n)
        await self.store.set_limit_override(p.name, override, dropped)
        self.limit_book.set_override(p.name, override)
        logger.info("limit %s set at runtime: %s", p.name, p.settings,
                    extra={"action": "limit_set", "limit": p.name})
        self._wake()
        return (await self.limits(LimitsQuery(name=p.name))).limits[0]

    async def limits_reset(self, p: LimitReset) -> LimitsResult:
        """Drop the runtime override of `p.name` (back to the config).
        Raises: errors.NotFound (no override of that name)."""
        check_override(self.limit_book, p.name)
        await self.store.set_limit_override(p.name, None, True)
        self.limit_book.set_override(p.name, None)
        logger.info("limit %s reset to the config", p.name,
                    extra={"action": "limit_reset", "limit": p.name})
        self._wake()
        if p.name in self.limit_book.defs:
            return await self.limits(LimitsQuery(name=p.name))
        return LimitsResult(now=(await self.store.limit_views(self.limit_book, [], False))[1])

    async def annotate_limits(self, job: Any) -> None:
        """A `get_job` view: the limits it consumes, and a full one in its reason."""
        uses, why = await self.store.job_limits(job.job_id, job.priority,
                                                job.status == "waiting", self.limit_book)
        job.limits = [LimitUse(name=n, units=u) for n, u in uses]
        if why is not None:
            limit_service.put_reason(job, why)

    async def complete_usage(self, p: Complete, text: str) -> CompleteResult:
        """`complete` with reported usage counted against budgets in the same transaction.
        Raises: errors.BadRequest (bad usage), and as `complete`."""
        usage = check_usage(p.usage)
        return await self.store.complete_counted(
            LeaseRef(job_id=p.job_id, worker_id=p.worker_id, token=p.token), text, usage,
            self.limit_book, self._backoff())


