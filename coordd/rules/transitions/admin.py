"""An operator's moves: `cancel` (a waiting or blocked job at once, a running one by
request to its holder) and `retry` (an ended job back to waiting, attempts reset).
"""

from __future__ import annotations

from coordd import errors
from coordd.rules.transitions.table import (
    CANCEL_NOW, CANCEL_REQUEST, CANCELLED, RETRIED, RUNNING, Decision,
)

CANCELLED_BY_ADMIN = "cancelled by admin"  # the reason of a job cancelled before it ran

# how a refusal names the job's state: `job J has succeeded`, `job J is running`
_STATE_WORDS = {"succeeded": "has succeeded", "failed": "has failed", "skipped": "was skipped",
                "cancelled": "was cancelled"}


def _in_state(job_id: str, status: str) -> str:
    return f"job {job_id} {_STATE_WORDS.get(status, f'is {status}')}"


def cancel(status: str, job_id: str) -> Decision | None:
    """An admin cancel of a job in `status`: waiting or blocked -> cancelled at once;
    running -> CANCEL_REQUEST (the store sets the flag; the holder ends it); cancelled ->
    None (nothing to write).

    Raises:
        errors.InvalidState: the job succeeded, failed or was skipped.
    """
    t = CANCEL_NOW.get(status)
    if t is not None:
        return Decision(t=t, last_error=CANCELLED_BY_ADMIN, reason=CANCELLED_BY_ADMIN)
    if status == RUNNING:
        return Decision(t=CANCEL_REQUEST, reason="cancel requested")
    if status == CANCELLED:
        return None
    raise errors.InvalidState(f"{_in_state(job_id, status)}: only a waiting, blocked or "
                              "running job can be cancelled")


def retry(status: str, job_id: str, now: float) -> Decision:
    """An admin retry: failed (dead letter), cancelled or skipped -> waiting at `now`,
    attempts reset, last_error cleared.

    Raises:
        errors.InvalidState: the job is waiting, blocked, running or succeeded.
    """
    t = RETRIED.get(status)
    if t is None:
        raise errors.InvalidState(f"{_in_state(job_id, status)}: only a failed, cancelled or "
                                  "skipped job can be retried")
    return Decision(t=t, reason="retried by admin", run_at=now)
