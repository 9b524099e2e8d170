"""PostgresStore's governance of running work and of workers (coordd.store.api_governance):
a lease's suspend/resume/vacate state, preemption's reservations, incarnations and
goodbyes, the workers' view. Every statement of it is here; the decisions are the pure
functions SQLite uses (coordd.rules.governance.plan, coordd.rules.preemption.choose,
coordd.rules.transitions.lost_lease's texts).

The rule not to break: a lease's governance state is decided and written only with its
lease row locked (`FOR UPDATE OF l`) in the transaction that read it (a renew's also by
its token), so two calls for one job never log one transition twice and a state never
lands on another run's lease.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from coordd import errors
from coordd.rules import governance
from coordd.rules import preemption
from coordd.rules import transitions as tr
from coordd.wire.protocol import ClaimResult, RenewResult
from coordd.wire.governance import Suspension
from coordd.store import lenient_json
from coordd.store import workers as wkstore
from coordd.store.api import LeaseRef
from coordd.store.api_governance import (
    Governance, JobGovernance, WorkerBook,
)
from coordd.store.postgres import admission, apply, liveness, resources, sql, taken, workflows
from coordd.store.postgres.sql import NOW

PREEMPT_LOCK_KEY = "coordd-preempt"  # one preemption scan at a time (xact advisory lock)
WORKER_LOST_TEXTS = apply._lost_texts(tr.WORKER_LOST)

# ---------------------------------------------------------------- heartbeat, goodbye

SQL_INCARNATION = "SELECT incarnation FROM workers WHERE worker_id = $1 FOR UPDATE"
SQL_SET_OFFLINE = f"UPDATE workers SET offline_at = {NOW} WHERE worker_id = $2"
# Every lease of worker $2 ends as coordd.rules.transitions.lost_lease(worker_lost) decides (the
# reaper's lease ends, sql.END_LOST_LEASES); $3..$9 its texts (WORKER_LOST_TEXTS).
SQL_LOSE_WORKER = (
    "WITH x AS (SELECT job_id FROM leases WHERE worker_id = $2 ORDER BY job_id FOR UPDATE), "
    + sql.END_LOST_LEASES +
    "SELECT job_id, status FROM j ORDER BY job_id"
)

SQL_FORGET_LOOK = (  # the worker row locked, how many leases it holds, NOW
    "SELECT heartbeat_at, offline_at, (SELECT count(*) FROM leases l WHERE l.worker_id = $2), "
    f"{NOW} FROM workers WHERE worker_id = $2 FOR UPDATE"
)
SQL_DELETE_WORKER = "DELETE FROM workers WHERE worker_id = $1"

# ---------------------------------------------------------------- governance of leases

_HELD = (  # coordd.rules.governance.plan's rows
    "l.job_id, j.priority, j.gates_json, l.suspended_at, l.suspend_reason, l.gate_open_at, "
    "l.vacate_reason, l.resume_at"
)
SQL_HELD_BY_WORKER = (
    f"SELECT {_HELD} FROM leases l JOIN jobs j ON j.job_id = l.job_id "
    "WHERE l.worker_id = $1 ORDER BY l.job_id FOR UPDATE OF l"
)
SQL_HELD_ONE = (  # $2 job, $3 worker, $4 token; `FOR UPDATE OF l` appended when writing
    f"SELECT {NOW}, w.heartbeat_json, {_HELD} FROM leases l JOIN jobs j ON j.job_id = l.job_id "
    "LEFT JOIN workers w ON w.worker_id = l.worker_id "
    "WHERE l.job_id = $2 AND l.worker_id = $3 AND l.token = $4"
)
SQL_SET_GOVERNANCE = (  # $1 job, $2 token (NULL: the row is locked already), the state
    "UPDATE leases SET suspended_at = $3, suspend_reason = $4, gate_open_at = $5, "
    "vacate_reason = $6, resume_at = $7 "
    "WHERE job_id = $1 AND ($2::bigint IS NULL OR token = $2)"
)
SQL_GOVERNED = (
    "SELECT worker_id, job_id, suspended_at, suspend_reason, vacate_reason, resume_at "
    "FROM leases WHERE suspended_at IS NOT NULL OR vacate_reason IS NOT NULL "
    "ORDER BY worker_id, job_id"
)

# ---------------------------------------------------------------- preemption

SQL_PREEMPT_START = (  # lapsed reservations go; is any job waiting at priority <= $2?
    f"WITH d AS (DELETE FROM reservations WHERE expires_at <= {NOW}) "
    "SELECT $2::int >= 0 AND EXISTS (SELECT 1 FROM jobs WHERE status = 'waiting' "
    "AND priority <= $2)"
)
SQL_PREEMPT_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext($1))"
SQL_PREEMPTING_CANDIDATES = (  # $2 worst priority, $3 limit
    "SELECT j.job_id, j.kind, j.required_role, j.priority, j.gates_json FROM jobs j "
    f"WHERE j.status = 'waiting' AND j.priority <= $2 AND j.run_at <= {NOW} "
    "AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.job_id = j.job_id) "
    "ORDER BY j.priority, j.queued_at, j.job_id LIMIT $3"
)
SQL_LIVE_WORKERS = (  # $2 heartbeat_stale_s
    "SELECT worker_id, roles_json, heartbeat_json, kinds_json FROM workers "
    f"WHERE heartbeat_at >= {NOW} - $2::float8 AND offline_at IS NULL ORDER BY worker_id"
)
SQL_ALL_HELD = (  # coordd.rules.preemption.Held's columns, then whether it is being vacated
    "SELECT l.worker_id, l.job_id, j.kind, j.priority, l.granted_at, "
    "CASE WHEN j.checkpoint_json IS NOT NULL AND j.updated_at > l.granted_at "
    "THEN j.updated_at ELSE l.granted_at END, l.vacate_reason IS NOT NULL "
    "FROM leases l JOIN jobs j ON j.job_id = l.job_id ORDER BY l.worker_id, l.job_id"
)
SQL_RESERVATIONS = (
    "SELECT r.worker_id FROM reservations r JOIN jobs j ON j.job_id = r.job_id "
    "WHERE j.status = 'waiting'"
)
SQL_INSERT_RESERVATION = (  # $2 job, $3 worker, $4 victim, $5 reservation_s
    "INSERT INTO reservations (job_id, worker_id, victim_job_id, created_at, expires_at) "
    f"VALUES ($2, $3, $4, {NOW}, {NOW} + $5::float8) ON CONFLICT (job_id) DO NOTHING "
    "RETURNING job_id"
)
SQL_MARK_VACATE = (
    "UPDATE leases SET vacate_reason = $2 WHERE job_id = $1 AND vacate_reason IS NULL"
)
# The claim's take of a job reserved on worker $2 (still waiting, of kinds $6 or any, the
# worker's heartbeat fresh within $5): as sql.SQL_CLAIM's take, the reservation deleted too.
SQL_RESERVED_CLAIM = (  # $3 lease_s, $4 claim_id
    "WITH c AS MATERIALIZED (SELECT j.job_id FROM reservations r JOIN jobs j "
    f"ON j.job_id = r.job_id WHERE r.worker_id = $2 AND r.expires_at > {NOW} "
    "AND j.status = 'waiting' AND ($6::text[] IS NULL OR j.kind = ANY($6::text[])) "
    "AND EXISTS (SELECT 1 FROM workers w WHERE w.worker_id = $2 "
    f"AND w.heartbeat_at >= {NOW} - $5::float8) ORDER BY r.created_at, r.job_id LIMIT 1 "
    "FOR UPDATE OF j SKIP LOCKED), "
    "j AS (UPDATE jobs SET status = 'running', attempts = jobs.attempts + 1, "
    f"last_token = jobs.last_token + 1, updated_at = {NOW} FROM c "
    "WHERE jobs.job_id = c.job_id RETURNING jobs.*), "
    "d AS (DELETE FROM reservations USING j WHERE reservations.job_id = j.job_id), "
    "l AS (INSERT INTO leases (job_id, worker_id, token, claim_id, granted_at, expires_at, "
    f"lease_s) SELECT job_id, $2, last_token, $4, {NOW}, {NOW} + $3::float8, $3::float8 FROM j), "
    "e AS (INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    f"SELECT job_id, {NOW}, $2, 'waiting', 'running', 'claimed (token ' || last_token || ')' "
    "FROM j) "
    "SELECT j.job_id, j.kind, j.required_role, j.priority, j.payload_json, j.attempts, "
    f"j.checkpoint_json, j.max_runtime_s, j.last_token, {NOW} + $3::float8, $3::float8 FROM j"
)
SQL_RESERVED_LEFT = admission.SQL_RESERVED_LEFT  # drop stale ones; any left?
SQL_JOB_GOVERNANCE = (  # the lease's state, preemptions, the reservation (or NULLs)
    "SELECT l.suspended_at, l.suspend_reason, l.vacate_reason, l.resume_at, j.preemptions, "
    "r.worker_id, r.victim_job_id, v.priority, r.expires_at FROM jobs j "
    "LEFT JOIN leases l ON l.job_id = j.job_id LEFT JOIN reservations r ON r.job_id = j.job_id "
    f"AND r.expires_at > {NOW} LEFT JOIN jobs v ON v.job_id = r.victim_job_id WHERE j.job_id = $2"
)

# ---------------------------------------------------------------- workers

SQL_WORKERS = (  # coordd.store.views.list_workers's row, the worker's state, then NOW
    "SELECT w.worker_id, w.roles_json, w.heartbeat_json, w.heartbeat_at, "
    "(SELECT count(*) FROM leases l WHERE l.worker_id = w.worker_id), w.incarnation, "
    f"w.kinds_json, w.broken_kinds_json, w.offline_at, {NOW} FROM workers w "
    "ORDER BY w.worker_id"
)


class Hint(preemption.ReservationHint):
    """coordd.rules.preemption.ReservationHint for a store written by many connections at
    once: a look that found no reservation lowers it only if nothing raised it since the
    look began (`epoch`)."""

    def __init__(self) -> None:
        super().__init__()
        self.epoch = 0

    def may_exist(self) -> None:
        self.epoch += 1
        self.maybe = True


class GovernancePostgres(liveness.LivenessPostgres):
    """Mixed into PostgresStore (its `_conn`)."""

    _conn: Any

    @functools.cached_property
    def reservation_hint(self) -> Hint:
        """Whether a reservation may exist (claims skip their look while not)."""
        return Hint()

    # ------------------------------------------------------------ heartbeat, renew

    async def renew_governed(self, ref: LeaseRef, lease_s: float, gov: Governance, *,
                             now: float | None = None
                             ) -> tuple[RenewResult, list[tuple[str, str]]]:
        """The batched, fenced renew, then the job's action: one read while its state
        stands, a locked re-read and write when it changes."""
        res = await self.renew(ref, lease_s, now=now)  # type: ignore[attr-defined]
        args = (now, ref.job_id, ref.worker_id, ref.token)
        async with self._conn() as conn:
            steps = _plan_one(gov, await conn.fetchrow(SQL_HELD_ONE, *args))
            if steps and steps[0].decision.state != steps[0].before:
                async with conn.transaction():
                    steps = _plan_one(gov, await conn.fetchrow(SQL_HELD_ONE + " FOR UPDATE OF l",
                                                               *args))
                    await write_steps(conn, now, ref.worker_id, ref.token, steps)
        actions, changes = governance.outcome(steps)
        res.action = actions[0] if actions else None
        return res, changes

    async def goodbye(self, worker_id: str, incarnation: str | None, *,
                      now: float | None = None) -> list[str]:
        """Offline at once, its leases ended (`worker_lost`). Raises: errors.NotFound."""
        async with self._conn() as conn, conn.transaction():
            row = await conn.fetchrow(SQL_INCARNATION, worker_id)
            if row is None:
                raise errors.NotFound(f"worker {worker_id} not found")
            if incarnation is not None and row[0] is not None and row[0] != incarnation:
                return []
            await conn.execute(SQL_SET_OFFLINE, now, worker_id)
            return await lose_worker(conn, now, worker_id)

    async def forget_worker(self, worker_id: str, stale_s: float, force: bool, *,
                            now: float | None = None) -> list[str]:
        """Drop a worker's row; its leases end (`worker_lost`). Returns the released job
        ids. Raises: errors.NotFound; errors.InvalidState (live or holding leases, and
        not `force`), with coordd.store.workers.forget's messages."""
        async with self._conn() as conn, conn.transaction():
            row = await conn.fetchrow(SQL_FORGET_LOOK, now, worker_id)
            if row is None:
                raise errors.NotFound(f"worker {worker_id} not found")
            heartbeat_at, offline_at, held, t = row
            if not force:
                wkstore.check_forget(worker_id, t, heartbeat_at, offline_at, held, stale_s)
            lost = await lose_worker(conn, now, worker_id)
            await conn.execute(SQL_DELETE_WORKER, worker_id)
        return lost

    # ------------------------------------------------------------ preemption

    async def _preempt(self, conn: Any, now: float | None, t: float, gov: Governance,
                       checked: bool = False) -> list[tuple[str, str, str]]:
        """The preemption walk (as coordd.store.sqlite.preemption_ops.preempt on SQLite) in
        the caller's transaction; `checked`: the heartbeat's statement found a job it may
        serve and the pacer said it is due (coordd.store.postgres.beats)."""
        pacer = gov.preemptor
        policy = pacer.policy
        if not checked and not await conn.fetchval(SQL_PREEMPT_START, now,
                                                   3 - policy.gap if policy.gap > 0 else -1):
            return []
        if not (checked or pacer.due(t)) or not await conn.fetchval(SQL_PREEMPT_LOCK,
                                                                    PREEMPT_LOCK_KEY):
            return []
        waiting = await conn.fetch(SQL_PREEMPTING_CANDIDATES, now, 3 - policy.gap,
                                   preemption.CANDIDATES_MAX)
        if not waiting:
            return []
        held: dict[str, list[preemption.Held]] = {}
        for row in await conn.fetch(SQL_ALL_HELD):
            held.setdefault(row[0], []).append(preemption.Held(*tuple(row)[:6],
                                                               vacating=row[6]))
        reserved: dict[str, int] = {}
        for (w,) in await conn.fetch(SQL_RESERVATIONS):
            reserved[w] = reserved.get(w, 0) + 1
        needs = await resources.requests_of(conn, [r[0] for r in waiting]) \
            if self._resources_seen else {}  # type: ignore[attr-defined]
        look = preemption.Look(
            waiting=[tuple(r) for r in waiting],
            workers=[tuple(r) for r in await conn.fetch(SQL_LIVE_WORKERS, now, policy.stale_s)],
            held=held, reserved=reserved, needs=needs,
            grants=(await resources.books(conn))[2] if needs else {})
        done = []
        for p in preemption.choose(look, gov.policies, policy, t):
            v = p.victim
            self.reservation_hint.may_exist()
            if await conn.fetchval(SQL_INSERT_RESERVATION, now, p.job_id, v.worker_id,
                                   v.job_id, policy.reservation_s) is None:
                continue
            await conn.execute(SQL_MARK_VACATE, v.job_id, p.why)
            await conn.execute(sql.SQL_EVENT, now, v.job_id, v.worker_id, tr.RUNNING,
                               tr.RUNNING, f"vacate: {p.why}")
            await conn.execute(sql.SQL_EVENT, now, p.job_id, v.worker_id, tr.WAITING,
                               tr.WAITING, p.reserved_text)
            done.append((p.job_id, v.job_id, v.worker_id))
        return done

    async def reserved_claim(self, worker_id: str, lease_s: float, claim_id: str | None,
                             stale_s: float, now: float | None,
                             kinds: Sequence[str] | None = None) -> ClaimResult | None:
        """The claim's look at reservations on `worker_id` (coordd.rules.preemption.
        reserved_claim): the reserved job, of one of `kinds` (None: any), taken under a new
        lease, or None (and the hint lowered when no reservation is left)."""
        hint = self.reservation_hint
        if not hint.maybe:
            return None
        epoch = hint.epoch
        async with self._conn() as conn:
            if claim_id is not None:  # a repeated claim_id gets its lease (Claims.claim)
                row = await conn.fetchrow(sql.SQL_CLAIM_REPLAY, now, worker_id, claim_id)
                if row is not None:
                    return taken.claimed(row)
            while True:
                row = await conn.fetchrow(SQL_RESERVED_CLAIM, now, worker_id, lease_s, claim_id,
                                          stale_s, None if kinds is None else list(kinds))
                if row is None:
                    break
                try:
                    return taken.claimed(row)
                except taken.Undecodable:
                    await taken.dead_letter(conn, now, row, worker_id)
            if not await conn.fetchval(SQL_RESERVED_LEFT, worker_id) and hint.epoch == epoch:
                hint.maybe = False
        return None

    # ------------------------------------------------------------ reads

    async def worker_book(self, *, now: float | None = None) -> WorkerBook:
        """Every worker's row and state, and the governance notes, in one snapshot."""
        async with self._conn() as conn, conn.transaction(isolation="repeatable_read",
                                                          readonly=True):
            rows = await conn.fetch(SQL_WORKERS, now)
            governed = await conn.fetch(SQL_GOVERNED)
            grants, reserved, _ = await resources.books(conn)
        notes: dict[str, list[str]] = {}
        for worker_id, *g in governed:
            notes.setdefault(worker_id, []).append("governance: " + governance.describe(*g))
        t = rows[0][-1] if rows else await self._now_of(now)
        return WorkerBook(
            now=t, notes=notes, grants=grants, reserved=reserved,
            rows=[(r[0], lenient_json(r[1], []), lenient_json(r[2], {}), r[3], r[4])
                  for r in rows],
            states={r[0]: wkstore.state_of(r[5], r[6], r[7], r[8]) for r in rows})

    async def job_governance(self, job_id: str, *, now: float | None = None) -> JobGovernance:
        """The job's lease suspension, preemptions and reservation, in one read."""
        async with self._conn() as conn:
            row = await conn.fetchrow(SQL_JOB_GOVERNANCE, now, job_id)
            request, grant = await resources.job_resources(conn, job_id)
        if row is None:
            return JobGovernance()
        at, reason, vacate, resume_at, preemptions, *held = row
        return JobGovernance(
            request=request, grant=grant,
            suspension=None if at is None and vacate is None else Suspension(
                suspended_at=at, suspend_reason=reason, vacate_reason=vacate,
                resume_at=resume_at),
            preemptions=preemptions,
            reservation=None if held[0] is None or held[2] is None else tuple(held))

    async def _now_of(self, now: float | None) -> float:
        async with self._conn() as conn:
            return await conn.fetchval(sql.SQL_NOW, now)


def _plan_one(gov: Governance, row: Any) -> list[governance.Step]:
    """coordd.rules.governance.plan for SQL_HELD_ONE's row ([] when the lease is gone)."""
    if row is None:
        return []
    return governance.plan(gov.policies, lenient_json(row[1], {}), row[0], [tuple(row)[2:]])


async def write_steps(conn: Any, now: float | None, worker_id: str, token: int | None,
                       steps: list[governance.Step]) -> None:
    """Store each changed state on its lease (the rows are locked) and log each event."""
    for st in steps:
        d = st.decision
        if d.state != st.before:
            s = d.state
            await conn.execute(SQL_SET_GOVERNANCE, st.job_id, token, s.suspended_at,
                               s.suspend_reason, s.gate_open_at, s.vacate_reason, s.resume_at)
        if d.event is not None:
            await conn.execute(sql.SQL_EVENT, now, st.job_id, worker_id, tr.RUNNING,
                               tr.RUNNING, d.event)


async def lose_worker(conn: Any, now: float | None, worker_id: str) -> list[str]:
    """End every lease of `worker_id` as `worker_lost` and settle the workflows of the
    nodes among them (locked first: coordd.store.postgres.workflows' lock order); a job
    requeued wakes claimers through its trigger. In the caller's transaction."""
    wids = await workflows.lock_of_worker(conn, worker_id)
    rows = await conn.fetch(SQL_LOSE_WORKER, now, worker_id, *WORKER_LOST_TEXTS)
    for wid in wids:
        await workflows.settle(conn, now, wid)
    return [r[0] for r in rows]
