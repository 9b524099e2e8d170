"""The fenced calls of a lease holder: renew, checkpoint, complete, fail, release.

Like everything in coordd.store, these run inside the writer's transaction and take
`now` from coordd's clock. Each lease carries a token that only grows for its job;
`renew`, `checkpoint`, `complete`, `fail` and `release` are refused unless the presented
lease is the job's current one and `now < expires_at` (docs/concepts/leases.md;
the check is coordd.rules.transitions.fence, what each call does to the job is its decision
there). Claims are coordd.store.sqlite.claims (re-exported here under their old names).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from coordd.store import jobs
from coordd.rules import transitions as tr
from coordd.store.sqlite.claims import (  # noqa: F401 (leases has always named them)
    BASE_REFUSALS_CACHED, LIMIT_SCAN, ClaimPolicy, claim, effective_priority,
)
from coordd.wire.protocol import ArtifactRef, CompleteResult, RenewResult, StatusResult
from coordd.store.jobs import SQL_CHECKPOINT, SQL_INSERT_ARTIFACT, SQL_JOB_FOR_LEASE, SQL_RENEW
from coordd.store import limits as limit_store  # noqa: F401 (tests patch it here)
from coordd.store import workflows
from coordd.rules.transitions import Held, backoff_delay  # noqa: F401 (leases names them)


def _check_lease(conn: sqlite3.Connection, now: float, job_id: str, worker_id: str,
                 token: int) -> Held:
    """Read the job's lease row and fence the call (coordd.rules.transitions.fence: NotFound,
    AlreadyCompleted, LeaseLost, LeaseExpired); return the row."""
    row = conn.execute(SQL_JOB_FOR_LEASE, (job_id,)).fetchone()
    return tr.fence(None if row is None else Held(*row), job_id, worker_id, token, now)


def fence(conn: sqlite3.Connection, now: float, job_id: str, worker_id: str, token: int) -> int:
    """Check a lease-holder call as `_check_lease` does (same errors); return the job's
    attempt number (its `attempts`, counted at claim)."""
    return _check_lease(conn, now, job_id, worker_id, token).attempts


def renew(conn: sqlite3.Connection, now: float, job_id: str, worker_id: str, token: int,
          lease_s: float) -> RenewResult:
    """Extend the caller's lease to `now + lease_s`.

    Raises:
        errors.LeaseLost: as `_check_lease`, or the job ran past its `max_runtime_s`.
        errors.LeaseExpired, errors.NotFound, errors.AlreadyCompleted: as `_check_lease`.
    """
    held = _check_lease(conn, now, job_id, worker_id, token)
    expires_at = tr.renew(held, job_id, now, lease_s)
    conn.execute(SQL_RENEW, (expires_at, lease_s, job_id))
    return RenewResult(expires_at=expires_at, lease_s=lease_s,
                       cancel_requested=bool(held.cancel_requested))


def checkpoint(conn: sqlite3.Connection, now: float, job_id: str, worker_id: str, token: int,
               checkpoint_json: str) -> None:
    """Store the job's latest checkpoint (fenced like `renew`)."""
    _check_lease(conn, now, job_id, worker_id, token)
    conn.execute(SQL_CHECKPOINT, (checkpoint_json, now, job_id))


def complete(conn: sqlite3.Connection, now: float, job_id: str, worker_id: str, token: int,
             result_json: str | None, artifact: ArtifactRef | None,
             backoff: Callable[[int], float] | None = None) -> CompleteResult:
    """Store the result and end the job `succeeded`, fenced like `renew`; what ends it
    otherwise (a requested cancel, a result that fails its schema) is
    coordd.rules.transitions.complete. The reply has the status and the schema's error, if any.
    A workflow node's end moves its workflow on in the same transaction
    (coordd.store.workflows.settle): dependents whose last dependency this was are queued.
    """
    held = _check_lease(conn, now, job_id, worker_id, token)
    d = tr.complete(held, now, result_json, artifact is not None, backoff)
    sha = None
    if artifact is not None and d.t is tr.COMPLETED:
        conn.execute(SQL_INSERT_ARTIFACT, (artifact.sha256, artifact.path, artifact.size, now))
        sha = artifact.sha256
    _apply(conn, now, job_id, worker_id, held, d, sha)
    return CompleteResult(status=d.t.to_status, error=d.invalid)


def fail(conn: sqlite3.Connection, now: float, job_id: str, worker_id: str, token: int,
         error: str, retryable: bool, backoff: Callable[[int], float]) -> StatusResult:
    """Record a failure (coordd.rules.transitions.fail): back to waiting after
    `backoff(attempts)` seconds if retryable and attempts remain, else `failed` (dead
    letter); `cancelled` if a cancel was requested."""
    held = _check_lease(conn, now, job_id, worker_id, token)
    d = tr.fail(held, now, error, retryable, backoff)
    _apply(conn, now, job_id, worker_id, held, d)
    return StatusResult(status=d.t.to_status, run_at=d.run_at)


def release(conn: sqlite3.Connection, now: float, job_id: str, worker_id: str, token: int,
            reason: str, checkpoint_json: str | None) -> StatusResult:
    """Hand a job back without spending its attempt (fenced like `renew`): the lease ends,
    the job is waiting and runnable at once (`preemptions` counts it), with
    `checkpoint_json` recorded first if given; `cancelled` if a cancel was requested."""
    held = _check_lease(conn, now, job_id, worker_id, token)
    d = tr.release(held, now, reason)
    if checkpoint_json is not None:
        conn.execute(SQL_CHECKPOINT, (checkpoint_json, now, job_id))
    _apply(conn, now, job_id, worker_id, held, d)
    return StatusResult(status=d.t.to_status, run_at=d.run_at)


def _apply(conn: sqlite3.Connection, now: float, job_id: str, worker_id: str, held: Held,
           d: tr.Decision, artifact_sha256: str | None = None) -> None:
    """Write a holder call's decision, then settle the node's workflow if it ended."""
    jobs.apply(conn, now, job_id, worker_id, d, artifact_sha256)
    if d.settle:
        workflows.settle(conn, now, held.workflow_id)
