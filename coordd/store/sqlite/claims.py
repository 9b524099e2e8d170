"""Claims: the walk that hands the best runnable job to a worker under a new lease.

Runs inside the writer's transaction like everything in coordd.store and takes `now`
from coordd's clock. The claim's take (waiting -> running) and the dead letter of
undecodable stored data are transitions of coordd.rules.transitions; the fenced calls of a
lease holder are coordd.store.sqlite.leases.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import sqlite3
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from coordd.jsontext import dumps

from coordd.store import jobs as jobstore
from coordd.store import claim_admission as admission
from coordd.rules import gates
from coordd.rules import resources
from coordd.rules import transitions as tr
from coordd.rules.claim_batch import Batch, NextClaim
from coordd.rules.claim_policy import (  # noqa: F401 (claims has always named them)
    BASE_REFUSALS_CACHED, CLAIM_SCAN, ClaimPolicy, effective_priority,
)
from coordd.rules.limits import LIMIT_REFUSED
from coordd.wire.protocol import ClaimedJob, ClaimResult, LeaseGrant
from coordd.jsontext import json_decode, lenient_json, maybe_json
from coordd.store.claim_index import (
    SQL_ANY_RUNNABLE, SQL_PAIR_LEVEL, SQL_PAIR_WALK, SQL_ROLE_KINDS,
)
from coordd.store.jobs import (
    SQL_CLAIMED_JOB, SQL_INSERT_LEASE, SQL_INSERT_LEASE_NO_CLAIM_ID, SQL_LEASE_BY_CLAIM_ID,
    SQL_TAKE, SQL_TAKEN, SQL_WORKER, event,
)
from coordd.store import limits as limit_store
from coordd.store.sqlite import preemption_ops as sqlite_preemption
from coordd.store.governance import SQL_DELETE_RESERVATION
from coordd.store.resources import grant_of


LIMIT_SCAN = 256  # candidates a claim may skip for their limits beyond CLAIM_SCAN


def claim(conn: sqlite3.Connection, now: float, worker_id: str, lease_s: float,
          claim_id: str | None, policy: ClaimPolicy,
          kinds_json: str | None = None) -> ClaimResult:
    """Hand the best runnable job to `worker_id` under a new lease (see `_claim_once`).

    Jobs whose stored data does not decode are dead-lettered on the way and skipped; each
    round dead-letters one, so the loop ends. `kinds_json` (a JSON list, or None for any)
    limits candidates to the kinds the worker can run.
    """
    while True:
        result = _claim_once(conn, now, worker_id, lease_s, claim_id, policy, kinds_json)
        if result is not None:
            return result


def _claim_once(conn: sqlite3.Connection, now: float, worker_id: str, lease_s: float,
                claim_id: str | None, policy: ClaimPolicy,
                kinds_json: str | None) -> ClaimResult | None:
    """Try once to hand out a job; None when the pick was dead-lettered (undecodable data).

    Order: lowest effective priority first, then longest queued (FIFO among equals). A
    job is a candidate when it is waiting, its `run_at` has come, the worker holds its
    role, and the gates of the job's own priority (merged with the job's overrides) pass
    on the worker's last readings. The claim index is led by (required_role, kind): one
    cursor per (role, kind) pair the worker can take, merged in claim order, so jobs it
    cannot take are never stepped over (`_pairs`). Without aging, one walk from P0
    (`_strict_walk`); with aging on, one seek per priority level, a lower level only
    searched for jobs old enough to reach the best effective priority found so far
    (`_aging_walk`). Either way a level is given up after CLAIM_SCAN candidates.
    Stored data that does not decode (payload, checkpoint, gate overrides) sends its job
    to the dead letter state (`payload_decode_error`, ...) with the attempt counted, and
    the search goes on: such a job is never handed out nor retried.

    Returns a ClaimResult; with no job, `reasons` holds refusal codes (`heartbeat_stale`,
    `no_matching_role`, gate codes), empty when nothing is runnable at all.
    """
    if claim_id is not None:
        row = conn.execute(SQL_LEASE_BY_CLAIM_ID, (worker_id, claim_id, now)).fetchone()
        if row is not None:
            return _claimed(conn, row[0], LeaseGrant(token=row[1], expires_at=row[2],
                                                     lease_s=row[3]))
    rows = policy.worker_rows
    worker = (conn.execute(SQL_WORKER, (worker_id,)).fetchone() if rows is None
              else rows.get(conn, worker_id))
    if worker is None:
        return ClaimResult(reasons=[gates.HEARTBEAT_STALE],
                           detail=f"worker {worker_id} never sent a heartbeat")
    age = now - worker[2]
    if age > policy.heartbeat_stale_s:
        return ClaimResult(reasons=[gates.HEARTBEAT_STALE],
                           detail=f"last heartbeat {age:.1f}s ago > {policy.heartbeat_stale_s:g}s")
    roles_json, heartbeat_json = worker[0], worker[1]
    judge = _Judge(policy, heartbeat_json, conn, worker_id, now)
    reserved = sqlite_preemption.reserved_claim(
        conn, now, worker_id, policy.reservations,
        None if kinds_json is None else json_decode(kinds_json))
    # capacity freed by a preemption: promised to this job (while its limits have room)
    if reserved is not None and judge.admits_limits(reserved):
        short = judge.admission.admit(reserved) if judge.admission is not None else None
        if short is not None:  # the victim's GPU memory is not free yet: nobody else's
            return ClaimResult(reasons=[resources.RESOURCES],
                               detail=f"reserved for job {reserved}: {short}")
        conn.execute(SQL_DELETE_RESERVATION, (reserved,))
        return judge.took(judge.record(_take(conn, now, worker_id, reserved, lease_s,
                                             claim_id)), worker_id)
    pairs = _pairs(conn, now, roles_json, kinds_json, policy.role_kinds)
    if policy.aging_interval_s <= 0:
        best = _strict_walk(conn, now, judge, pairs)
    else:
        best = _aging_walk(conn, now, judge, pairs)
    for job_id, why in judge.undecodable:
        _dead_letter(conn, now, job_id, worker_id, "waiting", gates.GATES_DECODE_ERROR, why)
    reasons = judge.reasons
    if best is None:
        if not reasons and conn.execute(SQL_ANY_RUNNABLE, (now,)).fetchone() is not None:
            reasons[gates.NO_MATCHING_ROLE] = ("no runnable job needs one of this worker's roles"
                                               + (" and kinds" if kinds_json else ""))
        return judge.refused(ClaimResult(reasons=list(reasons),
                                         detail="; ".join(reasons.values())))
    return judge.took(judge.record(_take(conn, now, worker_id, best[2], lease_s, claim_id)),
                      worker_id)


def _take(conn: sqlite3.Connection, now: float, worker_id: str, job_id: str, lease_s: float,
          claim_id: str | None) -> ClaimResult | None:
    """Move the chosen job to running under a new lease (None: dead-lettered on the way)."""
    if conn.execute(SQL_TAKE, (now, job_id)).rowcount != 1:  # the walk read it waiting
        raise RuntimeError(f"job {job_id} was not waiting when taken")
    row = conn.execute(SQL_TAKEN, (job_id,)).fetchone()
    kind, role, prio, payload_json, attempts, checkpoint_json, max_runtime_s, token = row
    try:
        payload = json_decode(payload_json)
    except msgspec.DecodeError as exc:
        _dead_letter(conn, now, job_id, worker_id, "running", gates.PAYLOAD_DECODE_ERROR,
                     str(exc))
        return None  # the claim goes on to the next candidate
    try:
        checkpoint_value = maybe_json(checkpoint_json)
    except msgspec.DecodeError as exc:
        _dead_letter(conn, now, job_id, worker_id, "running",
                     gates.CHECKPOINT_DECODE_ERROR, str(exc))
        return None
    if claim_id is None:
        conn.execute(SQL_INSERT_LEASE_NO_CLAIM_ID,
                     (job_id, worker_id, token, now, now + lease_s, lease_s))
    else:
        conn.execute(SQL_INSERT_LEASE, (job_id, worker_id, token, claim_id, now, now + lease_s,
                                        lease_s))
    t = tr.CLAIMED
    event(conn, job_id, now, worker_id, t.from_status, t.to_status, tr.claimed_reason(token))
    return ClaimResult(
        job=ClaimedJob(job_id=job_id, kind=kind, required_role=role, priority=prio,
                       payload=payload, attempts=attempts, checkpoint=checkpoint_value,
                       max_runtime_s=max_runtime_s),
        lease=LeaseGrant(token=token, expires_at=now + lease_s, lease_s=lease_s),
    )


class _Judge:
    """Whether one candidate passes its gates and its limits for this worker; refusals are
    gathered in `reasons` (first detail per code), jobs whose gate overrides do not decode
    in `undecodable` (dead-lettered by the caller once no cursor is open). `free_skip`:
    the last candidate was refused by its limits only, within LIMIT_SCAN of them, so it
    does not count against CLAIM_SCAN (no head-of-line blocking behind a full limit)."""

    def __init__(self, policy: ClaimPolicy, heartbeat_json: str, conn: sqlite3.Connection,
                 worker_id: str, now: float) -> None:
        self.policy, self.heartbeat_json = policy, heartbeat_json
        self._readings: dict[str, Any] | None = None
        self.reasons: dict[str, str] = {}
        self.undecodable: list[tuple[str, str]] = []
        self.admission = (admission.Admission(conn, worker_id, self.readings())
                          if admission.needed(policy.resources_seen, heartbeat_json) else None)
        book = policy.limits
        self.limits = limit_store.ClaimLimits(conn, now, book) \
            if book is not None and book.active else None
        self.free_skip = False
        self._limit_skips = 0

    def admits_limits(self, job_id: str, prio: int | None = None) -> bool:
        """True when the job's limits have room (always, with no limits defined)."""
        lim = self.limits
        if lim is None:
            return True
        if prio is None:
            prio = lim.conn.execute(SQL_CLAIMED_JOB, (job_id,)).fetchone()[2]
        if lim.admits(prio, job_id):
            return True
        self.reasons.setdefault(LIMIT_REFUSED, lim.detail or "limit")
        return False

    def took(self, result: ClaimResult | None, worker_id: str) -> ClaimResult | None:
        """Hold the limit units of the job just taken (a lease was granted)."""
        if self.limits is not None and result is not None and result.job is not None:
            self.limits.take(result.job.job_id, worker_id, result.job.priority)
        return result

    def refused(self, result: ClaimResult) -> ClaimResult:
        """A refusal; with a rate in the way, `next_slot_s` says when a unit frees."""
        lim = self.limits
        if lim is not None and lim.next_slot_at is not None:
            result.next_slot_s = max(0.0, lim.next_slot_at - lim.now)
        return result

    def record(self, result: ClaimResult | None) -> ClaimResult | None:
        """The taken job's resource grant on its lease (coordd.store.claim_admission), if any."""
        return result if self.admission is None else self.admission.record(result)

    def readings(self) -> dict[str, Any]:
        """The worker's stored readings, decoded on first use (a remembered base-gate
        answer needs none)."""
        if self._readings is None:
            self._readings = lenient_json(self.heartbeat_json, {})
        return self._readings

    def passes(self, prio: int, job_id: str, gates_json: str | None) -> bool:
        """True when the job's gates (its level's, merged with its own overrides) pass."""
        policy = self.policy
        refusals = policy.base_refusals(prio, self.heartbeat_json, self.readings)
        if gates_json is not None:
            try:
                refusals = gates.evaluate(
                    gates.merge(policy.policies[prio], json_decode(gates_json)), self.readings())
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                self.undecodable.append((job_id, str(exc)))
                return False
        for code, detail in refusals:
            self.reasons.setdefault(code, detail)
        self.free_skip = False
        if refusals:
            return False
        if self.admission is not None:
            short = self.admission.admit(job_id, prio)
            if short is not None:
                self.reasons.setdefault(resources.RESOURCES, short)
                return False
        if self.limits is None or self.admits_limits(job_id, prio):
            return True
        self._limit_skips += 1
        self.free_skip = self._limit_skips <= LIMIT_SCAN
        return False


def _pairs(conn: sqlite3.Connection, now: float, roles_json: str, kinds_json: str | None,
           role_kinds: Any) -> list[tuple[str, str]]:
    """The (role, kind) pairs a worker can take: its roles times its kinds, or, when it
    names no kinds, times the kinds waiting for each role (`role_kinds`, else one index
    seek per kind)."""
    roles = _roles(roles_json)
    if kinds_json is not None:
        kinds = sorted({k for k in json_decode(kinds_json) if isinstance(k, str)})
        return [(r, k) for r in roles for k in kinds]
    if role_kinds is not None:
        return [(r, k) for r in roles for k in role_kinds.kinds(conn, r, now)]
    return [(r, k) for r in roles for (k,) in conn.execute(SQL_ROLE_KINDS, (r,))]


@functools.lru_cache(maxsize=256)
def _roles(roles_json: str | None) -> tuple[str, ...]:
    """A worker row's roles (its JSON text as stored), sorted; what is not a list of
    strings holds none. Decoded once per text: a worker's claims all read the same."""
    roles = lenient_json(roles_json, [])
    return tuple(sorted({r for r in roles if isinstance(r, str)})) \
        if isinstance(roles, list) else ()


def _merged(cursors: list[sqlite3.Cursor]) -> Iterable[tuple[int, float, str, str | None]]:
    """Rows (priority, queued_at, job_id, gates_json) of ordered cursors, in claim order."""
    return cursors[0] if len(cursors) == 1 else heapq.merge(*cursors)


def _strict_walk(conn: sqlite3.Connection, now: float, judge: _Judge,
                 pairs: list[tuple[str, str]]) -> tuple[int, float, str] | None:
    """Strict priority: the first passing candidate in claim order, from P0 on; a level
    is given up after CLAIM_SCAN candidates (the walk starts again at the next level).
    Rows are stepped one at a time."""
    start = 0
    while pairs and start <= 3:
        again = None
        cursors = [conn.execute(SQL_PAIR_WALK, (role, kind, start, now))
                   for role, kind in pairs]
        try:
            level, seen = -1, 0
            for prio, queued_at, job_id, gates_json in _merged(cursors):
                if prio != level:
                    level, seen = prio, 0
                if seen == CLAIM_SCAN:
                    again = prio + 1
                    break
                seen += 1
                if judge.passes(prio, job_id, gates_json):
                    return prio, queued_at, job_id
                if judge.free_skip:
                    seen -= 1
        finally:
            for cur in cursors:
                cur.close()
        if again is None:
            return None
        start = again
    return None


def _aging_walk(conn: sqlite3.Connection, now: float, judge: _Judge,
                pairs: list[tuple[str, str]]) -> tuple[int, float, str] | None:
    """With aging: one seek per level (CLAIM_SCAN candidates at most); a lower level is
    only searched for jobs old enough to reach the best effective priority found so far.
    Returns (effective priority, queued_at, job_id) of the best."""
    aging_s = judge.policy.aging_interval_s
    best: tuple[int, float, str] | None = None
    for prio in (0, 1, 2, 3) if pairs else ():
        oldest = math.inf
        if best is not None:
            # a job here reaches effective priority best[0] only after (prio - best) steps
            oldest = now - (prio - best[0]) * aging_s + 1e-6  # the slack: float rounding
        scan = CLAIM_SCAN + (LIMIT_SCAN if judge.limits is not None else 0)
        cursors = [conn.execute(SQL_PAIR_LEVEL, (role, kind, prio, oldest, now, scan))
                   for role, kind in pairs]
        try:
            seen = 0
            for _p, queued_at, job_id, gates_json in itertools.islice(_merged(cursors), scan):
                if not judge.passes(prio, job_id, gates_json):
                    seen += not judge.free_skip
                    if seen == CLAIM_SCAN:
                        break
                    continue
                eff = effective_priority(prio, queued_at, now, aging_s)
                if best is None or (eff, queued_at) < (best[0], best[1]):
                    best = (eff, queued_at, job_id)
                break
        finally:
            for cur in cursors:
                cur.close()
    return best


def _dead_letter(conn: sqlite3.Connection, now: float, job_id: str, worker_id: str,
                 from_status: str, code: str, detail: str) -> None:
    """End a job `failed` because its stored data does not decode (terminal: no retry;
    coordd.rules.transitions.dead_letter)."""
    jobstore.apply(conn, now, job_id, worker_id, tr.dead_letter(from_status, code, detail))


def _claimed(conn: sqlite3.Connection, job_id: str, lease: LeaseGrant) -> ClaimResult:
    row = conn.execute(SQL_CLAIMED_JOB, (job_id,)).fetchone()
    return ClaimResult(
        job=ClaimedJob(job_id=job_id, kind=row[0], required_role=row[1], priority=row[2],
                       payload=json_decode(row[3]), attempts=row[4],
                       checkpoint=maybe_json(row[5]), max_runtime_s=row[6],
                       gpu_ids=list(grant.gpu_ids) or None
                       if (grant := grant_of(conn, job_id)) is not None else None),
        lease=lease,
    )


def claim_next(conn: sqlite3.Connection, now: float, nxt: NextClaim) -> ClaimResult:
    """A report's next claim, run in the report's own write: up to `nxt.max_jobs` claims
    in a row (coordd.rules.claim_batch, the Coordinator's rule)."""
    kinds_json = None if nxt.kinds is None else dumps(list(nxt.kinds))
    if nxt.max_jobs == 1:  # a batch of one is its one claim, under `claim_id` itself
        return claim(conn, now, nxt.worker_id, nxt.lease_s, nxt.claim_id, nxt.policy,
                     kinds_json)
    batch = Batch(nxt.claim_id, nxt.max_jobs)
    for claim_id in batch.ids():
        if not batch.add(claim(conn, now, nxt.worker_id, nxt.lease_s, claim_id, nxt.policy,
                               kinds_json)):
            break
    assert batch.result is not None
    return batch.result


def with_next(op: Callable[[Any, float], Any], nxt: NextClaim | None
              ) -> Callable[[Any, float], Any]:
    """`op` (a report: complete, fail, release) followed by its next claim in the same
    write; a report that raises claims nothing. `nxt` None: `op` itself."""
    if nxt is None:
        return op

    def both(conn: Any, t: float) -> Any:
        res = op(conn, t)
        res.next = claim_next(conn, t, nxt)
        return res
    return both
