"""SQLiteStore's governance and workers (coordd.store.api_governance): thin adapters over
the functions the SQLite Coordinator runs (coordd.governance, coordd.preemption,
coordd.store.workers, coordd.views), each write one op of the single writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coordd import governance, leases, store, views
from coordd.protocol import HeartbeatResult, RenewResult
from coordd.store import governance as govstore
from coordd.store import resources as resstore
from coordd.store import workers as wkstore
from coordd.store.api import LeaseRef
from coordd.store.api_governance import (
    ExplainBook, Governance, GovernedHeartbeat, JobGovernance, WorkerBeat, WorkerBook,
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
        roles_json, readings_json = store.dumps(sorted(set(roles))), store.dumps(readings)

        def op(conn: Any, t: float) -> GovernedHeartbeat:
            lost = wkstore.release_predecessor(conn, t, worker_id, beat.incarnation)
            cancel = store.heartbeat(conn, t, worker_id, roles_json, readings_json)
            wkstore.store_state(conn, worker_id, beat.incarnation, beat.kinds_json,
                                beat.broken_json)
            preempted = gov.preemptor.run(conn, t, gov.policies)
            actions, changes = governance.govern(conn, t, worker_id, gov.policies)
            return GovernedHeartbeat(
                result=HeartbeatResult(now=t, cancel=cancel, lost=lost, actions=actions),
                changes=changes, preempted=preempted)
        return await self._write(op, now, urgent=True)

    async def renew_governed(self, ref: LeaseRef, lease_s: float, gov: Governance, *,
                             now: float | None = None
                             ) -> tuple[RenewResult, list[tuple[str, str]]]:
        """`renew`, then coordd.governance.govern for the job, in one writer op."""
        def op(conn: Any, t: float) -> Any:
            res = leases.renew(conn, t, ref.job_id, ref.worker_id, ref.token, lease_s)
            actions, changes = governance.govern(conn, t, ref.worker_id, gov.policies,
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
