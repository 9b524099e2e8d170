"""SQLiteStore's governance and workers (coordd.store.api_governance): thin adapters over
`govern` here (coordd.rules.governance decides), coordd.store.sqlite.preemption_ops,
coordd.store.workers and coordd.store.views, each write one op of the single writer.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from coordd.jsontext import dumps, lenient_json
from coordd.store.jobs import event
from coordd.rules import governance
from coordd.store.sqlite import leases
from coordd.store import views
from coordd.rules.gates import GatePolicy
from coordd.wire.governance import JobAction
from coordd.wire.protocol import HeartbeatResult, RenewResult
from coordd.store import governance as govstore
from coordd.store.sqlite import preemption_ops as sqlite_preemption
from coordd.store import resources as resstore
from coordd.store import workers as wkstore
from coordd.store.api import LeaseRef
from coordd.store.api_governance import (
    ExplainBook, Governance, GovernedHeartbeat, JobGovernance, WorkerBeat, WorkerBook,
)
from coordd.store.governance import (
    SQL_HELD_BY_WORKER, SQL_HELD_ONE, SQL_LIVENESS_GRACE, SQL_SET_GOVERNANCE, SQL_TOUCH_WORKER,
    SQL_WORKER_READINGS,
)


class SQLiteGovernance:
    """Mixed into SQLiteStore (its `_write`, `_now` and `readers`)."""

    _write: Any
    _now: Any
    readers: Any

    async def heartbeat_governed(self, worker_id: str, roles: Sequence[str],
                                 readings: dict[str, Any], beat: WorkerBeat, gov: Governance,
                                 *, now: float | None = None) -> GovernedHeartbeat:
        """One writer op: the predecessor's leases, the heartbeat, the worker's state,
        preemption (paced), then each held job's governance."""
        roles_json, readings_json = dumps(sorted(set(roles))), dumps(readings)

        def op(conn: Any, t: float) -> GovernedHeartbeat:
            lost = wkstore.release_predecessor(conn, t, worker_id, beat.incarnation)
            cancel = wkstore.heartbeat(conn, t, worker_id, roles_json, readings_json)
            wkstore.store_state(conn, worker_id, beat.incarnation, beat.kinds_json,
                                beat.broken_json)
            preempted = sqlite_preemption.run(conn, t, gov.policies, gov.preemptor)
            held: list[Any] = []
            actions, changes = govern(conn, t, worker_id, gov.policies, held=held)
            return GovernedHeartbeat(
                result=HeartbeatResult(now=t, cancel=cancel, lost=lost, actions=actions),
                changes=changes, preempted=preempted, held=held)
        return await self._write(op, now, urgent=True)

    async def touch_workers(self, seen: Sequence[tuple[str, float, dict[str, Any] | None]],
                            gov: Governance, *, now: float | None = None
                            ) -> list[tuple[str, str, str]]:
        """One writer op: the batch of last-seen times and readings, then preemption
        (paced)."""
        rows = [(age, w, None if r is None else dumps(r)) for w, age, r in seen]

        def op(conn: Any, t: float) -> list[tuple[str, str, str]]:
            conn.executemany(SQL_TOUCH_WORKER, [(t, *row) for row in rows])
            return sqlite_preemption.run(conn, t, gov.policies, gov.preemptor)
        return await self._write(op, now, urgent=True)  # type: ignore[no-any-return]

    async def liveness_grace(self, bound_s: float, stale_s: float, *,
                             now: float | None = None) -> int:
        """coordd.store.api_governance's liveness grace, one writer op."""
        return await self._write(  # type: ignore[no-any-return]
            lambda conn, t: conn.execute(SQL_LIVENESS_GRACE, (t, bound_s, stale_s)).rowcount,
            now)

    async def renew_governed(self, ref: LeaseRef, lease_s: float, gov: Governance, *,
                             now: float | None = None
                             ) -> tuple[RenewResult, list[tuple[str, str]]]:
        """`renew`, then `govern` for the job, in one writer op."""
        def op(conn: Any, t: float) -> Any:
            res = leases.renew(conn, t, ref.job_id, ref.worker_id, ref.token, lease_s)
            actions, changes = govern(conn, t, ref.worker_id, gov.policies,
                                                 ref.job_id)
            res.action = actions[0] if actions else None
            return res, changes
        return await self._write(op, now, urgent=True)

    async def goodbye(self, worker_id: str, incarnation: str | None, *,
                      now: float | None = None) -> list[str]:
        """coordd.store.workers.goodbye."""
        return await self._write(lambda conn, t: wkstore.goodbye(conn, t, worker_id,
                                                                 incarnation), now, urgent=True)

    async def forget_worker(self, worker_id: str, stale_s: float, force: bool, *,
                            now: float | None = None) -> list[str]:
        """coordd.store.workers.forget."""
        return await self._write(lambda conn, t: wkstore.forget(conn, t, worker_id, stale_s,
                                                                force), now)

    async def worker_book(self, *, now: float | None = None) -> WorkerBook:
        """The reads of the Coordinator's `workers`."""
        notes: dict[str, list[str]] = {}
        for worker_id, rows in (await self.readers.run(govstore.governed)).items():
            notes[worker_id] = ["governance: " + governance.describe(*g) for g in rows]
        return WorkerBook(now=self._now(now), rows=await self.readers.run(views.list_workers),
                          states=await self.readers.run(wkstore.worker_states), notes=notes,
                          grants=await self.readers.run(resstore.all_grants),
                          reserved=await self.readers.run(resstore.reserved_requests))

    async def job_governance(self, job_id: str, *, now: float | None = None) -> JobGovernance:
        """The reads of the Coordinator's get_job for governance."""
        held = await self.readers.run(govstore.reservation_of, job_id)
        return JobGovernance(suspension=await self.readers.run(govstore.lease_state, job_id),
                             preemptions=await self.readers.run(wkstore.preemptions, job_id),
                             reservation=held if held is not None and held[3] > self._now(now)
                             else None,
                             request=await self.readers.run(resstore.request_of, job_id),
                             grant=await self.readers.run(resstore.grant_of, job_id))

    async def explain_book(self, *, now: float | None = None) -> ExplainBook:
        """The reads of the waiting reasons: views.list_workers, the workers' states."""
        return ExplainBook(now=self._now(now), rows=await self.readers.run(views.list_workers),
                           states=await self.readers.run(wkstore.worker_states))

    async def resource_book(self, job_ids: Sequence[str]
                            ) -> tuple[dict[str, Any], dict[str, list[Any]]]:
        requests = await self.readers.run(resstore.requests_of, list(job_ids)) \
            if job_ids else {}
        return requests, (await self.readers.run(resstore.all_grants) if requests else {})


def govern(conn: sqlite3.Connection, now: float, worker_id: str,
           policies: dict[int, GatePolicy], job_id: str | None = None,
           held: list[Any] | None = None
           ) -> tuple[list[JobAction], list[tuple[str, str]]]:
    """Decide for every job `worker_id` holds (or only `job_id`), inside the writer's
    transaction; store each new state on its lease and log each transition as an event.
    Returns (one JobAction per held job, [(action, reason code)] of the transitions);
    (priority, gates JSON) of each job decided for are appended to `held`."""
    row = conn.execute(SQL_WORKER_READINGS, (worker_id,)).fetchone()
    readings = lenient_json(row[0], {}) if row is not None else {}
    rows = (conn.execute(SQL_HELD_BY_WORKER, (worker_id,)) if job_id is None
            else conn.execute(SQL_HELD_ONE, (worker_id, job_id))).fetchall()
    steps = governance.plan(policies, readings, now, rows)
    if held is not None:
        held.extend((r[1], r[2]) for r in rows)
    for st in steps:
        d = st.decision
        if d.state != st.before:
            s = d.state
            conn.execute(SQL_SET_GOVERNANCE, (s.suspended_at, s.suspend_reason, s.gate_open_at,
                                              s.vacate_reason, s.resume_at, st.job_id))
        if d.event is not None:
            event(conn, st.job_id, now, worker_id, "running", "running", d.event)
    return governance.outcome(steps)
