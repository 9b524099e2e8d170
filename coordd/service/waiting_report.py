"""What `status` (and `coordctl top`) says about the waiting: the oldest due waiting jobs
of each priority with why each waits, and a warning for every P0 job (a user waiting)
that has waited longer than `warn_p0_wait_s`.

SQLite's read is coordd.store.waiting_heads.oldest_due (PostgreSQL's is
coordd.store.postgres.reads.oldest_waiting); `report` is pure, the same on every store:
jobs in, the list and the warnings out; `on_store` runs it over a store for the
Coordinator (coordd.service.reads).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from coordd.rules import explain
from coordd.wire.protocol import JobView, WaitingJob

PER_LEVEL = 3  # the oldest due waiting jobs shown per priority

Head = tuple[float, JobView]  # (when the job became runnable, its view)


def report(heads: list[Head], now: float, warn_p0_wait_s: float
           ) -> tuple[list[WaitingJob], list[str]]:
    """(the waiting list, P0 first then oldest first; the warnings: one naming the P0 jobs
    among `heads` that waited longer than `warn_p0_wait_s` (0: never), with their
    reasons). `heads` carry their `waiting_reason` already (coordd.rules.explain)."""
    shown = sorted((WaitingJob(job_id=j.job_id, kind=j.kind, required_role=j.required_role,
                               priority=j.priority, waited_s=max(0.0, now - ready),
                               reason=j.waiting_reason) for ready, j in heads),
                   key=lambda w: (w.priority, -w.waited_s, w.job_id))
    late = [w for w in shown if w.priority == 0 and warn_p0_wait_s > 0
            and w.waited_s > warn_p0_wait_s]
    if not late:
        return shown, []
    some = "at least " if len(late) >= PER_LEVEL else ""
    return shown, [f"{some}{len(late)} P0 job(s) waiting longer than warn_p0_wait_s "
                   f"({warn_p0_wait_s:g}s): " + "; ".join(
                       f"{w.job_id} ({w.kind}) {w.waited_s:.0f}s: {w.reason or 'waiting'}"
                       for w in late)]


async def on_store(store: Any, by_priority: dict[str, int], policies: dict[int, Any],
                   stale_s: float, warn_p0_wait_s: float, *, now: float | None = None,
                   explain_waiting: Callable[[list[JobView], float], Awaitable[None]]
                   | None = None) -> tuple[list[WaitingJob], list[str]]:
    """`report` over the store interface (`store.oldest_waiting`) for the levels that have
    waiting jobs (`by_priority`: "p0".. -> count). The reasons: `explain_waiting(jobs,
    now)` (the Coordinator's: gates, roles, kinds, resources, limits), else coordd.rules.explain
    on the workers' rows (`store.worker_book`)."""
    levels = [p for p in range(4) if by_priority.get(f"p{p}", 0)]
    if not levels:
        return [], []
    t, heads = await store.oldest_waiting(levels, PER_LEVEL, now=now)
    if heads and explain_waiting is not None:
        await explain_waiting([j for _, j in heads], t)
    elif heads:
        book = await store.worker_book(now=now)
        for _, j in heads:
            j.waiting_reason = explain.why_waiting(j, t, book.rows, book.states, policies,
                                                   stale_s)
    return report(heads, t, warn_p0_wait_s)
