"""Fencing: a lease-holder call (renew, checkpoint, complete, fail, release) is honoured
only under the job's current, unexpired lease. `Held` is the stored row such a call
decides on, `fence` checks the presented lease against it, `renew` gives the new expiry.
"""

from __future__ import annotations

from typing import Any

import msgspec

from coordd import errors
from coordd.rules.transitions.table import SUCCEEDED


class Held(msgspec.Struct, frozen=True):
    """The stored fields a fenced holder call decides on, in this order (the SQLite store
    builds it with `Held(*row)`). The lease fields are None when the job has no lease.

    status, cancel_requested (bool or 0/1), max_runtime_s (s or None), attempts (counted
    at claim), max_attempts, last_token (the newest token granted), lease_worker_id,
    lease_token, granted_at, expires_at (Unix s), result_schema, workflow_id.
    """

    status: str
    cancel_requested: Any
    max_runtime_s: float | None
    attempts: int
    max_attempts: int
    last_token: int
    lease_worker_id: str | None
    lease_token: int | None
    granted_at: float | None
    expires_at: float | None
    result_schema: str | None = None
    workflow_id: str | None = None


def fence(held: Held | None, job_id: str, worker_id: str, token: int, now: float) -> Held:
    """Fence a lease-holder call: the presented lease must be the job's current one and
    unexpired. `held` is the stored row (None: no such job). Returns `held`.

    Raises:
        errors.NotFound: no such job.
        errors.AlreadyCompleted: the job succeeded under this very lease (a resend after a
            lost reply: the stored result stands; treat as success).
        errors.LeaseLost: the presented lease is not the job's current lease (including a
            superseded lease of a job that later succeeded under another one).
        errors.LeaseExpired: it is, but `now >= expires_at` (whether or not reaped yet).
    """
    if held is None:
        raise errors.NotFound(f"job {job_id} not found")
    if held.lease_worker_id != worker_id or held.lease_token != token:
        if held.status == SUCCEEDED and token == held.last_token:
            raise errors.AlreadyCompleted(f"job {job_id} already succeeded")
        raise errors.LeaseLost(f"job {job_id}: lease token {token} of {worker_id} is not "
                               f"current (job is {held.status})")
    if now >= held.expires_at:  # type: ignore[operator]  # a lease row has one
        raise errors.LeaseExpired(
            f"job {job_id}: lease expired at {held.expires_at:.3f} (now {now:.3f})")
    return held


def renew(held: Held, job_id: str, now: float, lease_s: float) -> float:
    """The new `expires_at` of a fenced renew (`now + lease_s`).

    Raises:
        errors.LeaseLost: the job ran past its `max_runtime_s` (counted from the grant).
    """
    if held.max_runtime_s is not None and now > held.granted_at + held.max_runtime_s:  # type: ignore[operator]
        raise errors.LeaseLost(f"job {job_id}: max runtime {held.max_runtime_s:g}s exceeded")
    return now + lease_s
