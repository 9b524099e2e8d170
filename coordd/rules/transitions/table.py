"""The job state machine's table: the statuses of a job and of a workflow, the causes of a
move, every allowed transition (TABLE, WORKFLOW_TABLE) and `Decision`, what a store writes
for one of them. Data only; the decisions that pick a row are in the modules beside this
one (coordd.rules.transitions).
"""

from __future__ import annotations

import msgspec

# ---------------------------------------------------------------- statuses

WAITING, RUNNING, BLOCKED = "waiting", "running", "blocked"
SUCCEEDED, FAILED, CANCELLED, SKIPPED = "succeeded", "failed", "cancelled", "skipped"
JOB_STATUSES = (WAITING, RUNNING, SUCCEEDED, FAILED, CANCELLED, BLOCKED, SKIPPED)
NODE_TERMINAL = (SUCCEEDED, FAILED, CANCELLED, SKIPPED)  # a job's ends; a graph ends on them
PARTIAL = "partial"  # a workflow's end: some nodes succeeded, not all
WORKFLOW_ENDS = (SUCCEEDED, PARTIAL, FAILED, CANCELLED)

# ---------------------------------------------------------------- causes

ENQUEUE = "enqueue"  # inserted: waiting, or blocked (a workflow node with dependencies)
CLAIM = "claim"  # a claim took it under a new lease
COMPLETE = "complete"  # its holder stored the result
RESULT_INVALID = "result_invalid"  # the result failed its schema: an attempt spent
FAIL = "fail"  # its holder failed it: retry after backoff, or dead letter
RELEASE = "release"  # its holder handed it back (preemption, stop): no attempt spent
CANCEL_REQUESTED = "cancel_requested"  # a holder's end, or a lost lease, met a requested cancel
LEASE_EXPIRED = "lease_expired"  # the reaper found its lease expired
WORKER_LOST = "worker_lost"  # its worker restarted, said goodbye or was forgotten
CANCEL = "cancel"  # an admin cancel: at once, or (running -> running) the request
RETRY = "retry"  # an admin retry of an ended job, attempts reset
DEAD_LETTER = "dead_letter"  # a claim found its stored data undecodable
DEPENDENCIES_MET = "dependencies_met"  # a node's dependencies all ended: queued
DEPENDENCY_ENDED = "dependency_ended"  # a `skip`-policy dependency did not succeed
WORKER_ABSENT = "worker_absent"  # a waiting node whose role no live worker offers
REOPEN = "reopen"  # a retried node waits for its dependencies again / is unskipped
SETTLE = "settle"  # (workflows) every node has ended
LOST_LEASE_CODES = (LEASE_EXPIRED, WORKER_LOST)


class Transition(msgspec.Struct, frozen=True):
    """One allowed move of a job (or workflow): `from_status` (None: inserted) ->
    `to_status`, for `cause` (one of the cause constants above)."""

    from_status: str | None
    to_status: str
    cause: str


def _t(from_status: str | None, to_status: str, cause: str) -> Transition:
    return Transition(from_status, to_status, cause)


ENQUEUED = _t(None, WAITING, ENQUEUE)
ENQUEUED_BLOCKED = _t(None, BLOCKED, ENQUEUE)
CLAIMED = _t(WAITING, RUNNING, CLAIM)
COMPLETED = _t(RUNNING, SUCCEEDED, COMPLETE)
INVALID_RETRY = _t(RUNNING, WAITING, RESULT_INVALID)
INVALID_FAILED = _t(RUNNING, FAILED, RESULT_INVALID)
FAIL_RETRY = _t(RUNNING, WAITING, FAIL)
FAIL_FAILED = _t(RUNNING, FAILED, FAIL)
RELEASED = _t(RUNNING, WAITING, RELEASE)
CANCEL_HONOURED = _t(RUNNING, CANCELLED, CANCEL_REQUESTED)
LOST = {code: (_t(RUNNING, WAITING, code), _t(RUNNING, FAILED, code))
        for code in LOST_LEASE_CODES}  # code -> (requeued, attempts exhausted)
CANCEL_NOW = {s: _t(s, CANCELLED, CANCEL) for s in (WAITING, BLOCKED)}
CANCEL_REQUEST = _t(RUNNING, RUNNING, CANCEL)
RETRIED = {s: _t(s, WAITING, RETRY) for s in (FAILED, CANCELLED, SKIPPED)}
DEAD_LETTERED = {s: _t(s, FAILED, DEAD_LETTER) for s in (WAITING, RUNNING)}
PROMOTED = _t(BLOCKED, WAITING, DEPENDENCIES_MET)
SKIPPED_DEP = _t(BLOCKED, SKIPPED, DEPENDENCY_ENDED)
SKIPPED_ABSENT = _t(WAITING, SKIPPED, WORKER_ABSENT)
REBLOCKED = _t(WAITING, BLOCKED, REOPEN)
UNSKIPPED = _t(SKIPPED, BLOCKED, REOPEN)

TABLE: frozenset[Transition] = frozenset([
    ENQUEUED, ENQUEUED_BLOCKED, CLAIMED, COMPLETED, INVALID_RETRY, INVALID_FAILED,
    FAIL_RETRY, FAIL_FAILED, RELEASED, CANCEL_HONOURED, *(t for p in LOST.values() for t in p),
    *CANCEL_NOW.values(), CANCEL_REQUEST, *RETRIED.values(), *DEAD_LETTERED.values(),
    PROMOTED, SKIPPED_DEP, SKIPPED_ABSENT, REBLOCKED, UNSKIPPED,
])
"""Every allowed job transition. By cause:

- enqueue: None -> waiting; None -> blocked (a workflow node with dependencies).
- claim: waiting -> running (a new lease, its token one up, the attempt counted).
- complete: running -> succeeded (result stored, lease ended).
- result_invalid: running -> waiting (after backoff) | failed (attempts exhausted).
- fail: running -> waiting (retryable, attempts left, after backoff) | failed (the
  dead letter: a permanent error or attempts exhausted).
- release: running -> waiting (runnable at once; the attempt is given back).
- cancel_requested: running -> cancelled (complete, fail, release or a lost lease of a
  job whose cancel was requested; a result is dropped).
- lease_expired, worker_lost: running -> waiting (at once) | failed (attempts spent).
- cancel: waiting | blocked -> cancelled; running -> running (the request, a flag).
- retry: failed | cancelled | skipped -> waiting (attempts reset).
- dead_letter: waiting -> failed (gate overrides undecodable; the attempt counted);
  running -> failed (payload or checkpoint undecodable, found just after the take).
- dependencies_met: blocked -> waiting (dependency results in the payload).
- dependency_ended: blocked -> skipped (a `skip`-policy dependency did not succeed).
- worker_absent: waiting -> skipped (a node no live worker can take, past its wait).
- reopen: waiting -> blocked (a retried node with dependencies); skipped -> blocked
  (skipped because of a node now retried).
"""

WORKFLOW_TABLE: frozenset[Transition] = frozenset(
    [_t(None, RUNNING, ENQUEUE)] + [_t(RUNNING, s, SETTLE) for s in WORKFLOW_ENDS]
    + [_t(s, RUNNING, REOPEN) for s in WORKFLOW_ENDS])
"""Every allowed workflow transition: enqueue (None -> running); settle (running -> an end
of WORKFLOW_ENDS, when every node has ended); reopen (an end -> running, a node retried)."""


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """What a store writes for one job transition.

    `t`: the row of TABLE (from, to, cause). `last_error`: the job's new last_error (None:
    cleared or, for a cancel request, untouched). `reason`: the event's reason.
    `run_at`: back to waiting: runnable from then (Unix seconds). `drop_lease`: the lease
    row goes. `settle`: a workflow node ended: settle its workflow in the same transaction.
    `result_json`: succeeded: the result to store (normalized by its schema).
    `invalid`: complete refused by the result schema: the validation error (the reply's).
    `count_attempt`: dead letter only: the attempt is counted now (not counted at claim).
    """

    t: Transition
    last_error: str | None = None
    reason: str | None = None
    run_at: float | None = None
    drop_lease: bool = False
    settle: bool = False
    result_json: str | None = None
    invalid: str | None = None
    count_attempt: bool = False
