"""The fencing of PostgresStore's lease-holding statements, shared by its areas (jobs,
limits, artifacts, logs): a fenced statement carries the lease (job, worker, token) in its
WHERE, and when it matches nothing, `refusal` reads the job again and says why in
coordd.rules.transitions' words; `end_lease` is the fenced lease end of a complete or a fail.
"""

from __future__ import annotations

from typing import Any

from coordd import errors
from coordd.rules import transitions as tr
from coordd.store.api import LeaseRef
from coordd.store.postgres import apply, sql


async def refusal(conn: Any, now: float | None, ref: LeaseRef,
                  renew: bool = False) -> errors.CoordError:
    """The typed error for a fenced statement that matched nothing: coordd.rules.transitions'
    fence (and, for a renew, its max-runtime rule) on the job as read right after."""
    row = await conn.fetchrow(sql.SQL_FENCE_STATE, now, ref.job_id)
    try:
        h = tr.fence(None if row is None else apply.held(row), ref.job_id, ref.worker_id,
                     ref.token, row[-1] if row is not None else 0.0)
        if renew:
            tr.renew(h, ref.job_id, row[-1], 0.0)
    except errors.CoordError as exc:
        return exc
    return Raced(f"job {ref.job_id}: fenced write raced; retry")


class Raced(errors.CoordError):
    """A fenced statement matched nothing, yet the lease checks out: it raced (or, for a
    complete, the job has a result schema and is completed apart)."""


async def end_lease(conn: Any, now: float | None, ref: LeaseRef) -> tuple[Any, float]:
    """Lock the job and end the presented lease if it is the live one: (Held, now).
    Raises the fencing errors."""
    row = await conn.fetchrow(sql.SQL_END_LEASE, now, ref.job_id, ref.worker_id, ref.token)
    if row is None:
        raise await refusal(conn, now, ref)
    return apply.held(row), row[-1]
