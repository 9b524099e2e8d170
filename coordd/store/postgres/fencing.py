"""Why a fenced statement matched no lease: the same typed errors as coordd.leases.

A holder call's UPDATE/DELETE carries the fence itself (token and `expires_at > now`);
when it matches nothing, the job's state read right after says which refusal it was.
Pure: a row in, an error out.
"""

from __future__ import annotations

from typing import Any

from coordd import errors


def refusal(row: Any, job_id: str, worker_id: str, token: int,
            renew: bool = False) -> errors.CoordError | None:
    """The error for a fenced call that matched nothing, or None when the lease is the
    job's current, live one after all (a race with another statement: try again).

    Args:
        row: (status, last_token, lease worker, lease token, expires_at, granted_at,
            max_runtime_s, now) of coordd.store.postgres.sql.SQL_FENCE_STATE, or None.
        renew: also check the job's max runtime (renew refuses past it).
    """
    if row is None:
        return errors.NotFound(f"job {job_id} not found")
    status, last_token, l_worker, l_token, expires, granted, max_runtime_s, now = row
    if l_worker != worker_id or l_token != token:
        if status == "succeeded" and token == last_token:
            return errors.AlreadyCompleted(f"job {job_id} already succeeded")
        return errors.LeaseLost(f"job {job_id}: lease token {token} of {worker_id} is not "
                                f"current (job is {status})")
    if now >= expires:
        return errors.LeaseExpired(f"job {job_id}: lease expired at {expires:.3f} "
                                   f"(now {now:.3f})")
    if renew and max_runtime_s is not None and now > granted + max_runtime_s:
        return errors.LeaseLost(f"job {job_id}: max runtime {max_runtime_s:g}s exceeded")
    return None
