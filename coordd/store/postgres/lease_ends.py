"""PostgresStore's lease ends and admin transitions (coordd.store.api): checkpoint, fail,
release, reap, restart grace, cancel, retry. Each decision is the pure one SQLite takes
(coordd.rules.transitions), applied in the transaction that locked the row; a job these
put back to `waiting` wakes the parked claims through its trigger's NOTIFY
(coordd.store.postgres.push_sql)."""

from __future__ import annotations

from typing import Any

from coordd import errors
from coordd.rules import transitions as tr
from coordd.wire.protocol import StatusResult
from coordd.store.api import Backoff, LeaseRef
from coordd.store.postgres import apply, grace, sql, workflows
from coordd.store.postgres.fence import end_lease, refusal


class LeaseEndsPostgres:
    """Mixed into PostgresStore (its `_conn`, and `in_report`, `next_in` of
    coordd.store.postgres.eager)."""

    _conn: Any
    in_report: Any
    next_in: Any

    async def checkpoint(self, ref: LeaseRef, checkpoint_json: str, *,
                         now: float | None = None) -> None:
        """Store the job's latest checkpoint (fenced in the same UPDATE)."""
        async with self._conn() as conn:
            if await conn.fetchval(sql.SQL_CHECKPOINT, now, ref.job_id, ref.worker_id,
                                   ref.token, checkpoint_json) is None:
                raise await refusal(conn, now, ref)

    async def fail(self, ref: LeaseRef, error: str, retryable: bool, backoff: Backoff, *,
                   now: float | None = None, then: Any = None) -> StatusResult:
        """A failed attempt: back to waiting after `backoff(attempts)` when retryable with
        attempts left, else `failed` (dead letter); `cancelled` if a cancel was requested.
        `then`: the next claim, in the same transaction (coordd.store.postgres.eager)."""
        eager = await self.in_report(then)
        async with self._conn() as conn, conn.transaction():
            wid = await workflows.lock_of_job(conn, ref.job_id)  # the workflow, then the job
            held, t = await end_lease(conn, now, ref)
            d = tr.fail(held, t, text(error), retryable, backoff)
            await apply.apply(conn, now, ref.job_id, ref.worker_id, d)
            if d.settle:
                await workflows.settle(conn, now, wid)
            nxt = await self.next_in(conn, now, then, eager)
        return StatusResult(status=d.t.to_status, run_at=d.run_at, next=nxt)

    async def release(self, ref: LeaseRef, reason: str, checkpoint_json: str | None = None,
                      *, now: float | None = None, then: Any = None) -> StatusResult:
        """Hand the job back without spending its attempt (`preemptions` counts it),
        recording `checkpoint_json` first if given; `cancelled` if a cancel was requested.
        `then`: the next claim, in the same transaction (coordd.store.postgres.eager)."""
        eager = await self.in_report(then)
        async with self._conn() as conn, conn.transaction():
            wid = await workflows.lock_of_job(conn, ref.job_id)
            held, t = await end_lease(conn, now, ref)
            d = tr.release(held, t, text(reason))
            await apply.apply(conn, now, ref.job_id, ref.worker_id, d, checkpoint_json)
            if d.settle:
                await workflows.settle(conn, now, wid)
            nxt = await self.next_in(conn, now, then, eager)
        return StatusResult(status=d.t.to_status, run_at=d.run_at, next=nxt)

    async def reap(self, *, limit: int = 1000, now: float | None = None) -> int:
        """End up to `limit` expired leases: plain jobs' in one statement (sql.SQL_REAP),
        workflow nodes' one transaction each, settling their workflows
        (workflows.reap_nodes)."""
        async with self._conn() as conn:
            n, _ = await conn.fetchrow(sql.SQL_REAP, now, limit, *apply.REAP_TEXTS)
            nodes, _ = await workflows.reap_nodes(conn, now, limit - n)
        return n + nodes

    async def restart_grace(self, *, now: float | None = None) -> int:
        """Give every stored lease at least one more lease_s from now (a coordd starting
        to serve: coordd.store.postgres.grace); return how many."""
        async with self._conn() as conn:
            return await grace.restart_grace(conn, now)

    async def cancel(self, job_id: str, *, now: float | None = None) -> StatusResult:
        """waiting/blocked -> cancelled; running -> cancel requested (renew and heartbeat
        say so); cancelled stays. Raises: NotFound, InvalidState."""
        async with self._conn() as conn, conn.transaction():
            wid = await workflows.lock_of_job(conn, job_id)
            status = await locked_status(conn, now, job_id)
            d = tr.cancel(status, job_id)
            if d is not None:  # None: already cancelled
                await apply.apply(conn, now, job_id, None, d)
            await workflows.settle(conn, now, wid)  # a node's dependents follow
        return StatusResult(status=status if d is None else d.t.to_status)

    async def retry(self, job_id: str, *, now: float | None = None) -> StatusResult:
        """failed/cancelled/skipped -> waiting, attempts reset; a workflow node reopens its
        workflow (blocked again if it has dependencies). Raises: NotFound, InvalidState."""
        async with self._conn() as conn, conn.transaction():
            wid = await workflows.lock_of_job(conn, job_id)
            status, t = await locked_status(conn, now, job_id, with_now=True)
            d = tr.retry(status, job_id, t)
            await apply.apply(conn, now, job_id, None, d)
            node = await workflows.reopen(conn, now, job_id, wid)  # a node reopens its graph
        if node is not None and node != d.t.to_status:
            return StatusResult(status=node)
        return StatusResult(status=d.t.to_status, run_at=d.run_at)


def text(free: str) -> str:
    """Free text (a worker's error, a release reason) as PostgreSQL can store it: its
    text type holds no NUL, so each becomes U+FFFD rather than refusing the write."""
    return free.replace("\x00", "\ufffd")


async def locked_status(conn: Any, now: float | None, job_id: str,
                         with_now: bool = False) -> Any:
    """The job's status, its row locked (with the statement's now if asked).
    Raises: errors.NotFound."""
    row = await conn.fetchrow(sql.SQL_LOCK_STATUS, now, job_id)
    if row is None:
        raise errors.NotFound(f"job {job_id} not found")
    return (row[0], row[1]) if with_now else row[0]
