"""How a running job ends: its holder's `complete`, `fail` and `release` (after fencing),
a lease whose holder is gone (`lost_lease`: expired, or the worker lost), a claim's dead
letter of undecodable data (and a claim's event reason), and the retry delay
(`backoff_delay`). Each returns the Decision a store writes; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgspec

from coordd.rules import results
from coordd.rules.times import fmt_time
from coordd.rules.transitions.fencing import Held
from coordd.rules.transitions.table import (
    CANCEL_HONOURED, COMPLETED, DEAD_LETTERED, FAIL_FAILED, FAIL_RETRY, INVALID_FAILED,
    INVALID_RETRY, LOST, RELEASED, WAITING, Decision, Transition,
)

Backoff = Callable[[int], float]  # attempts so far -> seconds before the next try


def _no_backoff(_attempts: int) -> float:
    return 0.0


def complete(held: Held, now: float, result_json: str | None, has_artifact: bool,
             backoff: Backoff | None = None) -> Decision:
    """A fenced complete: `succeeded` with the result; `cancelled` (result dropped) when a
    cancel was requested; with a `result_schema`, a result that fails it (or an artifact:
    it cannot be checked) spends the attempt as `result_invalid` (back to waiting after
    `backoff(attempts)` s, or `failed` once exhausted), `invalid` holding the error."""
    wf = held.workflow_id is not None
    if held.cancel_requested:
        return Decision(t=CANCEL_HONOURED, last_error="cancelled before completion",
                        reason="cancel requested; result dropped", drop_lease=True, settle=wf)
    if held.result_schema is not None:
        try:
            if has_artifact:
                raise results.ResultInvalid(f"result_invalid ({held.result_schema}): a "
                                            "checked result must be inline, not an artifact")
            result_json = results.check(held.result_schema, result_json or "null")
        except results.ResultInvalid as exc:
            d = _spend(held, now, str(exc), True, backoff or _no_backoff,
                       INVALID_RETRY, INVALID_FAILED)
            return msgspec.structs.replace(d, invalid=str(exc))
    return Decision(t=COMPLETED, result_json=result_json, drop_lease=True, settle=wf)


def fail(held: Held, now: float, error: str, retryable: bool, backoff: Backoff) -> Decision:
    """A fenced fail: back to waiting after `backoff(attempts)` s if retryable and attempts
    remain, else `failed` (dead letter); `cancelled` if a cancel was requested."""
    if held.cancel_requested:
        return Decision(t=CANCEL_HONOURED, last_error=error, reason=error, drop_lease=True,
                        settle=held.workflow_id is not None)
    return _spend(held, now, error, retryable, backoff, FAIL_RETRY, FAIL_FAILED)


def _spend(held: Held, now: float, error: str, retryable: bool, backoff: Backoff,
           again: Transition, dead: Transition) -> Decision:
    if not retryable or held.attempts >= held.max_attempts:
        why = f"permanent: {error}" if not retryable else f"attempts exhausted (last: {error})"
        return Decision(t=dead, last_error=why, reason=why, drop_lease=True,
                        settle=held.workflow_id is not None)
    run_at = now + backoff(held.attempts)
    return Decision(t=again, last_error=error, run_at=run_at, drop_lease=True,
                    reason=f"retryable: {error}; backoff until {fmt_time(run_at)}")


def release(held: Held, now: float, reason: str) -> Decision:
    """A fenced release: back to waiting at once without spending the attempt (the store
    gives it back and counts a preemption); `cancelled` if a cancel was requested."""
    if held.cancel_requested:
        return Decision(t=CANCEL_HONOURED, last_error=reason, reason=reason, drop_lease=True,
                        settle=held.workflow_id is not None)
    why = f"released: {reason}"
    return Decision(t=RELEASED, last_error=why, reason=why, run_at=now, drop_lease=True)


def lost_lease(worker_id: str, attempts: int, max_attempts: int, cancel_requested: Any,
               code: str, now: float) -> Decision:
    """A lease whose holder is gone (`code`: lease_expired or worker_lost): waiting at once
    (at the back of its priority), `failed` once attempts are spent, `cancelled` if a
    cancel was requested. The attempt counts (it was counted at claim). The workflow is
    not settled here: the maintenance sweep moves it on (as before this module).

    Raises:
        KeyError: `code` is not one of LOST_LEASE_CODES.
    """
    requeued, exhausted = LOST[code]
    if cancel_requested:
        return Decision(t=CANCEL_HONOURED, last_error=f"{code} after cancel", reason=code,
                        drop_lease=True)
    if attempts >= max_attempts:
        why = f"attempts exhausted (last: {code})"
        return Decision(t=exhausted, last_error=why, reason=why, drop_lease=True)
    return Decision(t=requeued, last_error=f"{code} (worker {worker_id} lost)", run_at=now,
                    reason=code, drop_lease=True)


def dead_letter(from_status: str, code: str, detail: str) -> Decision:
    """A job whose stored data does not decode, found by a claim: `failed` for good.
    `from_status` waiting (gate overrides: the attempt is counted now) or running
    (payload/checkpoint, just taken: counted by the take). `code` is the event reason."""
    return Decision(t=DEAD_LETTERED[from_status], last_error=f"{code}: {detail}",
                    reason=code, count_attempt=from_status == WAITING)


def claimed_reason(token: int) -> str:
    """The event reason of CLAIMED."""
    return f"claimed (token {token})"


def backoff_delay(attempts: int, base_s: float, cap_s: float, jitter: float, u: float) -> float:
    """Retry delay in seconds: min(cap, base * 2**(attempts-1)) * (1 + u * jitter), u in [0, 1).

    The jitter only adds, so a retry never comes sooner than the un-jittered delay.
    """
    exp = min(cap_s, base_s * math.pow(2.0, min(max(0, attempts - 1), 62)))  # no overflow
    return exp * (1.0 + u * jitter)
