"""PostgresStore's heartbeat (coordd.store.api_governance: `heartbeat_governed`): one
statement for the common beat, more only for what it found.

The statement stores the readings, roles, kinds and state, drops lapsed reservations,
and returns what the rest needs: the stored incarnation, the held jobs whose cancel was
requested, how many leases the worker holds, and whether a preemption look may be due
(coordd.store.postgres.governance's SQL_PREEMPT_START). It moves the incarnation only
where no predecessor's leases must end first; a new incarnation ends them
(governance.lose_worker) and takes its place in one transaction of its own, so a crash
between the two leaves the old incarnation stored and the next beat ends them again. Preemption
and the held leases' governance then run in their own transactions (each decided with
its rows locked, as before).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coordd.rules import governance
from coordd.wire.protocol import HeartbeatResult
from coordd.store import dumps
from coordd.store.api_governance import Governance, GovernedHeartbeat, WorkerBeat
from coordd.store.postgres.governance import SQL_HELD_BY_WORKER, lose_worker, write_steps
from coordd.store.postgres.sql import NOW

# $2 worker, $3 roles JSON, $4 readings JSON, $5 incarnation, $6 kinds JSON,
# $7 broken kinds JSON, $8 the worst priority a preemption may serve (-1: off)
SQL_BEAT = (
    "WITH old AS (SELECT incarnation FROM workers WHERE worker_id = $2 FOR UPDATE), "
    f"d AS (DELETE FROM reservations WHERE expires_at <= {NOW}), "
    "w AS (INSERT INTO workers (worker_id, roles_json, heartbeat_json, heartbeat_at, "
    "first_seen_at, incarnation, kinds_json, broken_kinds_json, offline_at) "
    f"VALUES ($2, $3, $4, {NOW}, {NOW}, $5, $6, $7, NULL) ON CONFLICT (worker_id) DO UPDATE "
    "SET roles_json = excluded.roles_json, heartbeat_json = excluded.heartbeat_json, "
    "heartbeat_at = excluded.heartbeat_at, incarnation = CASE WHEN excluded.incarnation "
    "IS NULL OR workers.incarnation IS NULL OR workers.incarnation = excluded.incarnation "
    "THEN excluded.incarnation ELSE workers.incarnation END, "
    "kinds_json = excluded.kinds_json, broken_kinds_json = excluded.broken_kinds_json, "
    "offline_at = NULL) "
    f"SELECT {NOW}, (SELECT incarnation FROM old), "
    "coalesce((SELECT array_agg(l.job_id ORDER BY l.job_id) FROM leases l "
    "JOIN jobs j ON j.job_id = l.job_id WHERE l.worker_id = $2 AND j.cancel_requested), "
    "'{}'::text[]), (SELECT count(*) FROM leases WHERE worker_id = $2), "
    "$8::int >= 0 AND EXISTS (SELECT 1 FROM jobs WHERE status = 'waiting' "
    "AND priority <= $8)"
)
SQL_LOCK_INCARNATION = "SELECT incarnation FROM workers WHERE worker_id = $1 FOR UPDATE"
SQL_SET_INCARNATION = "UPDATE workers SET incarnation = $2 WHERE worker_id = $1"


class BeatsPostgres:
    """Mixed into PostgresStore (its `_conn`, `_preempt`, `beat_stored`)."""

    _conn: Any
    _preempt: Any
    beat_stored: Any

    async def heartbeat_governed(self, worker_id: str, roles: Sequence[str],
                                 readings: dict[str, Any], beat: WorkerBeat, gov: Governance,
                                 *, now: float | None = None) -> GovernedHeartbeat:
        """Store the beat (one statement); a new incarnation ends the predecessor's leases,
        preemption runs (paced), every held job gets its action (see the module)."""
        roles = sorted(set(roles))
        gap = gov.preemptor.policy.gap
        async with self._conn() as conn:
            t, stored, cancel, held, preempt = await conn.fetchrow(
                SQL_BEAT, now, worker_id, dumps(roles), dumps(readings), beat.incarnation,
                beat.kinds_json, beat.broken_json, 3 - gap if gap > 0 else -1)
            lost: list[str] = []
            if beat.incarnation is not None and stored not in (None, beat.incarnation):
                async with conn.transaction():
                    if await conn.fetchval(SQL_LOCK_INCARNATION, worker_id) == stored:
                        lost = await lose_worker(conn, now, worker_id)
                        await conn.execute(SQL_SET_INCARNATION, worker_id, beat.incarnation)
                cancel = [j for j in cancel if j not in lost]
            preempted = []
            if preempt and gov.preemptor.due(t):
                async with conn.transaction():
                    preempted = await self._preempt(conn, now, t, gov, checked=True)
            steps: list[Any] = []
            rows: list[Any] = []
            if held and not lost:
                async with conn.transaction():
                    rows = await conn.fetch(SQL_HELD_BY_WORKER, worker_id)
                    steps = governance.plan(gov.policies, readings, t, rows)
                    await write_steps(conn, now, worker_id, None, steps)
        self.beat_stored(worker_id, roles)
        actions, changes = governance.outcome(steps)
        return GovernedHeartbeat(
            result=HeartbeatResult(now=t, cancel=list(cancel), lost=lost, actions=actions),
            changes=changes, preempted=preempted, held=[(r[1], r[2]) for r in rows])

__all__ = ["BeatsPostgres", "SQL_BEAT"]
