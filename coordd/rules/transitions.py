"""The job state machine: every allowed transition of a job and of a workflow, and the
pure decisions that pick one.

Rows in, decisions out: no SQL, no connection, no I/O. A store reads the fields a decision
names, calls it, and applies what it returns with its own statements (the SQLite store in
coordd.store and coordd.store.sqlite.leases; another store with its own SQL). The one rule: a
store writes a job's `status` only as a decision from here says, so every change a reader can
see in `job_events` is a row of TABLE (tests/unit/test_transitions.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from coordd import errors
from coordd.rules import results
from coordd.rules.times import fmt_time

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


# ---------------------------------------------------------------- fencing


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


# ---------------------------------------------------------------- holder outcomes

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


# ---------------------------------------------------------------- admin

CANCELLED_BY_ADMIN = "cancelled by admin"  # the reason of a job cancelled before it ran


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
    raise errors.InvalidState(f"job {job_id} is {status}; only waiting/blocked/running cancel")


def retry(status: str, job_id: str, now: float) -> Decision:
    """An admin retry: failed (dead letter), cancelled or skipped -> waiting at `now`,
    attempts reset, last_error cleared.

    Raises:
        errors.InvalidState: the job is waiting, blocked, running or succeeded.
    """
    t = RETRIED.get(status)
    if t is None:
        raise errors.InvalidState(
            f"job {job_id} is {status}; only failed/cancelled/skipped retry")
    return Decision(t=t, reason="retried by admin", run_at=now)


# ---------------------------------------------------------------- workflows


class Node(msgspec.Struct):
    """A workflow node as settle reads it: (job_id, name, status, role, last_error)."""

    job_id: str
    name: str
    status: str
    role: str
    last_error: str | None


class NodeStep(msgspec.Struct, frozen=True, kw_only=True):
    """One node moved by settle. `t`: PROMOTED or SKIPPED_DEP. `reason`: the event's (and
    a skip's last_error). `inputs`: promoted: (name, job_id) of each succeeded
    dependency, whose results go in its payload; `missing`: names of the dependencies
    (policy `run`) that did not succeed."""

    job_id: str
    t: Transition
    reason: str
    inputs: tuple[tuple[str, str], ...] = ()
    missing: tuple[str, ...] = ()


class Settlement(msgspec.Struct, frozen=True):
    """What settle decided: the node `steps` to apply in order; `status`: the workflow's
    end (one of WORKFLOW_ENDS) when every node has ended, else None; its `summary`."""

    steps: list[NodeStep]
    status: str | None = None
    summary: dict[str, Any] | None = None


def settle(nodes: list[Node], edges: Iterable[tuple[str, str, str]]) -> Settlement:
    """Move a workflow forward as far as its nodes' states allow (pure; `nodes` in stored
    order are updated in place with the decided statuses).

    `edges`: (dependent job_id, dependency job_id, policy `skip` | `run`). Each blocked
    node whose dependencies have all ended is skipped (a dependency did not succeed and
    its edge's policy is `skip`; reason `dependency_<status>: <node>`) or promoted
    (dependencies met). Skips cascade. When every node has ended the workflow's status is
    `succeeded` (all nodes), `partial` (some), `cancelled` (every node cancelled), else
    `failed`.
    """
    by_id = {n.job_id: n for n in nodes}
    deps: dict[str, list[tuple[str, str]]] = {}
    for job_id, dep_id, policy in edges:
        deps.setdefault(job_id, []).append((dep_id, policy))
    steps: list[NodeStep] = []
    changed = True
    while changed:
        changed = False
        for n in nodes:
            if n.status != BLOCKED:
                continue
            mine = deps.get(n.job_id, [])
            if any(by_id[d].status not in NODE_TERMINAL for d, _ in mine):
                continue
            unmet = [(by_id[d], p) for d, p in mine if by_id[d].status != SUCCEEDED]
            fatal = next((d for d, p in unmet if p == "skip"), None)
            if fatal is not None:
                reason = f"dependency_{fatal.status}: {fatal.name}"
                steps.append(NodeStep(job_id=n.job_id, t=SKIPPED_DEP, reason=reason))
                n.status, n.last_error = SKIPPED, reason
            else:
                missing = tuple(d.name for d, _ in unmet)
                steps.append(NodeStep(
                    job_id=n.job_id, t=PROMOTED, missing=missing,
                    inputs=tuple((by_id[d].name, d) for d, _ in mine
                                 if by_id[d].status == SUCCEEDED),
                    reason="dependencies met" + (f"; running without {', '.join(missing)}"
                                                 if missing else "")))
                n.status = WAITING
            changed = True
    if any(n.status not in NODE_TERMINAL for n in nodes):
        return Settlement(steps)
    summary = summarize(nodes)
    ok = len(summary[SUCCEEDED])
    if ok == len(nodes):
        status = SUCCEEDED
    elif ok:
        status = PARTIAL
    else:  # nothing succeeded: cancelled if that is all that happened, else failed
        status = CANCELLED if len(summary[CANCELLED]) == len(nodes) else FAILED
    return Settlement(steps, status, summary)


def summarize(nodes: Iterable[Any]) -> dict[str, Any]:
    """The operator's to-do list: what succeeded, failed (with errors), was skipped (with
    reasons) or cancelled, and the roles no worker offered (`missing_roles`). `nodes`
    have name, status, role, last_error."""
    out: dict[str, Any] = {"succeeded": [], "failed": [], "skipped": [], "cancelled": [],
                           "missing_roles": []}
    for n in nodes:
        if n.status == SUCCEEDED:
            out["succeeded"].append(n.name)
        elif n.status in (FAILED, SKIPPED, CANCELLED):
            out[n.status].append({"node": n.name, "reason": n.last_error})
            if n.status == SKIPPED and (n.last_error or "").startswith(WORKER_ABSENT) \
                    and n.role not in out["missing_roles"]:
                out["missing_roles"].append(n.role)
    return out


def node_payload(payload: Any, inputs: Iterable[tuple[str, Any, dict[str, Any] | None]],
                 missing: Iterable[str]) -> dict[str, Any]:
    """A promoted node's payload: its own (a non-object is wrapped as {"payload": ...})
    with `inputs` (dependency name -> result), `input_artifacts` (name -> {sha256, size,
    path}, only those with one) and `missing_inputs` (names, only if any). `inputs`:
    (name, decoded result, artifact dict or None) per succeeded dependency."""
    if not isinstance(payload, dict):
        payload = {"payload": payload}
    got, arts = {}, {}
    for name, result, artifact in inputs:
        got[name] = result
        if artifact:
            arts[name] = artifact
    payload["inputs"] = got
    if arts:
        payload["input_artifacts"] = arts
    missing = list(missing)
    if missing:
        payload["missing_inputs"] = missing
    return payload


def absent_reason(role: str, waited_s: float, wait_s: float) -> str:
    """The reason (and last_error) of SKIPPED_ABSENT."""
    return f"{WORKER_ABSENT}: no live worker with role {role} for {waited_s:.0f}s (wait {wait_s:g}s)"


def backoff_delay(attempts: int, base_s: float, cap_s: float, jitter: float, u: float) -> float:
    """Retry delay in seconds: min(cap, base * 2**(attempts-1)) * (1 + u * jitter), u in [0, 1).

    The jitter only adds, so a retry never comes sooner than the un-jittered delay.
    """
    exp = min(cap_s, base_s * math.pow(2.0, min(max(0, attempts - 1), 62)))  # no overflow
    return exp * (1.0 + u * jitter)
