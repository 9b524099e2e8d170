"""What the Coordinator checks and says of fleet-wide limits beside the claim: the
`limits` methods' names and checks, reported usage on `complete`, a waiting job's limit
reason, the limits' views (the methods: coordd.service.areas).

Runtime overrides are stored first and only then installed in the LimitBook the claim
reads (coordd.limits), so a claim never admits on a setting that is not yet durable; a
restart loads them again.
"""

from __future__ import annotations

import math
import sqlite3
from typing import Any

from coordd import errors
from coordd.limits import RESERVE_KEYS, LimitBook, check_metric
from coordd.protocol_limits import LimitHolder, LimitsQuery, LimitView
from coordd.store import limits as limit_store

LIMIT_METHODS = ("limits", "limits_set", "limits_reset")
USAGE_METRICS_MAX = 16


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
