"""The fleet-wide limits' RPC methods (`limits`, `limits_set`, `limits_reset`) and what
the Coordinator asks of limits beside the claim: a waiting job's limit reason, reported
usage on `complete`, the gauges.

Runtime overrides are written through the writer first and only then installed in the
LimitBook the claim reads (coordd.limits), so a claim never admits on a setting that is
not yet durable; a restart loads them again (`load`).
"""

from __future__ import annotations

import logging
import math
import sqlite3
from typing import Any

from coordd import errors
from coordd.limits import RESERVE_KEYS, LimitBook, check_metric
from coordd.protocol_limits import (
    LimitHolder, LimitReset, LimitSet, LimitsQuery, LimitsResult, LimitUse, LimitView,
)
from coordd.store import limits as limit_store

logger = logging.getLogger(__name__)

LIMIT_METHODS = ("limits", "limits_set", "limits_reset")
USAGE_METRICS_MAX = 16


class FleetLimits:
    """Limits over one Coordinator's writer and reader.

    Args:
        book: the effective limits (the claim reads the same object).
        writer / read: the Coordinator's writer and `await read(fn, *args)`.
        clock: coordd's clock.
        on_change: called after a committed change (parked claims look again).
    """

    def __init__(self, book: LimitBook, writer: Any, read: Any, clock: Any,
                 on_change: Any = None) -> None:
        self.book, self._writer, self._read, self._clock = book, writer, read, clock
        self.on_change = on_change

    @classmethod
    def serve(cls, coord: Any) -> "FleetLimits":
        """Give a Coordinator its limits: `coord.fleet_limits` over its LimitBook, writer
        and reads, and the methods limits / limits_set / limits_reset. After its push."""
        fl = coord.fleet_limits = cls(coord.limit_book, coord.writer, coord.read, coord.clock,
                                      on_change=coord.push.limits_changed)
        for method in LIMIT_METHODS:
            setattr(coord, method, getattr(fl, method))
        return fl

    async def load(self) -> None:
        """Install the runtime overrides stored in the database (at start)."""
        rows = await self._read(limit_store.overrides)
        for name, why in self.book.load_overrides(rows):
            logger.warning("runtime override of limit %s ignored: %s", name, why,
                           extra={"action": "limit_override_ignored", "limit": name})

    async def limits(self, p: LimitsQuery | None = None) -> LimitsResult:
        """Every limit (or `p.name`) with its use now. Raises: NotFound (no such limit)."""
        p = p or LimitsQuery()
        names = names_asked(self.book, p)
        now = self._clock.wall()
        views = await self._read(read_views, now, self.book, names, p.holders)
        return LimitsResult(limits=views, now=now)

    async def limits_set(self, p: LimitSet) -> LimitView:
        """Change (or create) limit `p.name` at runtime; kept in the database, so a
        restart keeps it; it takes precedence over the config's keys it names.

        Raises: errors.BadRequest (a bad key or value: nothing changes).
        """
        override, limit = self.book.preview(p.name, p.settings)
        old = self.book.defs.get(p.name)
        dropped = old is not None and old.rate_n and not limit.rate_n
        await self._writer.run(lambda conn, now: limit_store.set_override(
            conn, now, p.name, override, bool(dropped)))
        self.book.set_override(p.name, override)
        logger.info("limit %s set at runtime: %s", p.name, p.settings,
                    extra={"action": "limit_set", "limit": p.name})
        self._changed()
        return (await self.limits(LimitsQuery(name=p.name))).limits[0]

    async def limits_reset(self, p: LimitReset) -> LimitsResult:
        """Drop the runtime override of `p.name` (back to the config; a limit only set at
        runtime goes away, and jobs naming it are no longer held back).

        Raises: errors.NotFound (no override of that name).
        """
        check_override(self.book, p.name)
        await self._writer.run(lambda conn, now: limit_store.set_override(
            conn, now, p.name, None, True))
        self.book.set_override(p.name, None)
        logger.info("limit %s reset to the config", p.name,
                    extra={"action": "limit_reset", "limit": p.name})
        self._changed()
        return await self.limits(LimitsQuery(name=p.name)) if p.name in self.book.defs \
            else LimitsResult(now=self._clock.wall())

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def check_usage(self, usage: dict[str, float] | None) -> dict[str, float] | None:
        """Check a `complete`'s reported usage (`check_usage`). Raises: errors.BadRequest."""
        return check_usage(usage)

    def counting(self, job_id: str, usage: dict[str, float] | None, op: Any) -> Any:
        """The writer op `op` (a `complete`), then the job's reported `usage` counted
        against its limits' budgets in the same transaction.

        Raises: errors.BadRequest (bad usage: checked now, before anything is queued)."""
        usage = self.check_usage(usage)
        if not usage:
            return op

        def counted(conn: sqlite3.Connection, now: float) -> Any:
            res = op(conn, now)
            if self.book.active:
                limit_store.record_usage(conn, now, job_id, usage, self.book)
            return res
        return counted

    async def annotate(self, job: Any, now: float) -> None:
        """A `get_job` view: the limits it consumes, and a full one in its reason (one
        read)."""
        waiting = job.status == "waiting" and self.book.active
        uses, why = await self._read(read_annotation, now, self.book, job.job_id, job.priority,
                                     waiting)
        job.limits = [LimitUse(name=n, units=u) for n, u in uses]
        if why is not None:
            put_reason(job, why)

    async def explain(self, jobs: list[Any], now: float) -> None:
        """Put the limit that holds each waiting job back into its `waiting_reason` (in
        front of a gate's; instead of "runnable")."""
        waiting = [(j.job_id, j.priority) for j in jobs if j.status == "waiting"]
        if not waiting or not self.book.active:
            return
        why = await self._read(_limit_reasons, now, self.book, waiting)
        for j in jobs:
            reason = why.get(j.job_id)
            if reason is not None:
                put_reason(j, reason)



def check_usage(usage: dict[str, float] | None) -> dict[str, float] | None:
    """Check a `complete`'s reported usage (None when there is none).
    Raises: errors.BadRequest."""
    if not usage:
        return None
    if len(usage) > USAGE_METRICS_MAX:
        raise errors.BadRequest(f"usage: at most {USAGE_METRICS_MAX} metrics")
    for metric, amount in usage.items():
        try:
            check_metric("usage", metric)
        except ValueError as exc:
            raise errors.BadRequest(str(exc)) from exc
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) \
                or not math.isfinite(amount) or amount < 0:
            raise errors.BadRequest(f"usage.{metric} must be a finite number >= 0, "
                                    f"got {amount!r}")
    return usage


def names_asked(book: LimitBook, p: LimitsQuery) -> list[str]:
    """The limits a `limits` call shows. Raises: errors.NotFound (no such limit)."""
    if p.name is None:
        return list(book.defs)
    if p.name not in book.defs:
        raise errors.NotFound(f"no limit {p.name!r} (known: {', '.join(book.defs) or 'none'})")
    return [p.name]


def check_override(book: LimitBook, name: str) -> None:
    """Raise errors.NotFound unless `name` has a runtime override (`limits_reset`)."""
    if not book.has_override(name):
        raise errors.NotFound(f"limit {name!r} has no runtime override")


def put_reason(job: Any, reason: str) -> None:
    """Put a limit's `reason` in front of a job view's waiting_reason (instead of "runnable")."""
    old = job.waiting_reason
    job.waiting_reason = reason if not old or old.startswith("runnable") else f"{reason}; {old}"


def read_annotation(conn: sqlite3.Connection, now: float, book: LimitBook, job_id: str,
                    priority: int, waiting: bool) -> tuple[list[tuple[str, int]], str | None]:
    """The limits a job consumes and, if `waiting`, why they hold it back (SQLite)."""
    uses = limit_store.job_limits(conn, job_id)
    if not (uses and waiting):
        return uses, None
    return uses, _limit_reasons(conn, now, book, [(job_id, priority)]).get(job_id)


def _limit_reasons(conn: sqlite3.Connection, now: float, book: LimitBook,
                   jobs: list[tuple[str, int]]) -> dict[str, str]:
    check = limit_store.ClaimLimits(conn, now, book, prune=False)
    out = {}
    for job_id, prio in jobs:
        check.detail = None
        if not check.admits(prio, job_id) and check.detail is not None:
            out[job_id] = check.detail
    return out


def read_views(conn: sqlite3.Connection, now: float, book: LimitBook, names: list[str],
               with_holders: bool) -> list[LimitView]:
    """The LimitViews of `names` (SQLite reads, `limit_view` builds them)."""
    out = []
    for name in names:
        limit = book.defs[name]
        rate_used = limit_store.window_used(conn, name, now, limit.rate_window_s) \
            if limit.rate_n else 0
        frees = None
        if limit.rate_n and rate_used >= limit.rate_n:  # full: when its oldest unit frees
            frees = limit_store.window_frees(conn, name, now, limit.rate_window_s,
                                             rate_used - limit.rate_n + 1)
        out.append(limit_view(
            limit, now, limit_store.held(conn, name), rate_used, frees,
            {m: limit_store.usage(conn, name, m, now, b[1]) for m, b in limit.budget.items()},
            limit_store.waiting_for(conn, name),
            limit_store.holders(conn, name) if with_holders else []))
    return out


def limit_view(limit: Any, now: float, used: int, rate_used: int, frees_at: float | None,
               budget_used: dict[str, float], waiting: int,
               holders: list[tuple[str, str, int, int, float]]) -> LimitView:
    """A limit's LimitView from what a store read (pure): `used` units held, `rate_used`
    in the window, `frees_at` (a full rate: when its oldest unit frees), usage per
    metric, waiting jobs naming it, holders (job, worker, priority, units, since)."""
    usable: dict[str, int | None] = {}
    for prio in range(4):
        room = [] if limit.concurrency is None else \
            [limit.concurrency - limit.held_back(prio) - used]
        if limit.rate_n:
            room.append(limit.rate_n - limit.held_back(prio) - rate_used)
        usable[f"p{prio}"] = max(0, min(room)) if room else None
    next_slot = None if frees_at is None else max(0.0, frees_at - now)
    settings = limit.settings()
    return LimitView(
        name=limit.name, source=limit.source, concurrency=limit.concurrency, rate=limit.rate,
        reserve=settings["reserve"], used=used, rate_used=rate_used, next_slot_s=next_slot,
        usable=usable, waiting=waiting,
        holders=[LimitHolder(job_id=j, worker_id=w, priority=pr, units=u, since=s)
                 for j, w, pr, u, s in holders],
        budget=settings["budget"], budget_used=budget_used,
        budget_reserve={k: v for k, v in zip(RESERVE_KEYS, limit.budget_reserve) if v})
