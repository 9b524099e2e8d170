"""PostgresStore's reports with their next claim in one transaction (eager dispatch:
`then`, a coordd.rules.claim_batch.NextClaim, on complete, fail and release).

The rule, as on SQLite: the report and its next claim commit together or not at all, so
a worker whose report is stored also holds the job it was handed (one commit per job, not
two). Completes with a next claim are batched like plain completes: one transaction holds
one complete statement for the lot and one claim statement per claim group
(coordd.store.postgres.claims.Claims.claim_in). A transaction that fails is run again
item by item (coordd.store.postgres.batch), so one bad item fails only its report.
With limits, aging, per-job gates or resources in play the claim takes the admission
path on the same connection (coordd.store.postgres.admission). A next claim of more than
one job, or one that may find a reservation outside the admission path, is not run
here: `next` stays None and the Coordinator claims after the report
(coordd.service.dispatch).
"""

from __future__ import annotations

from typing import Any

from coordd.rules.claim_batch import NextClaim
from coordd.wire.protocol import CompleteResult
from coordd.store.postgres import admission, apply, sql


# the complete statement's plan from the session's cache: left to itself, the planner
# plans it anew at every call (a custom plan: a quarter of a millisecond; docs/decisions.md)
SQL_GENERIC_PLANS = "SET LOCAL plan_cache_mode = force_generic_plan"


class EagerPostgres:
    """Mixed into PostgresStore (its `_conn`, claims, reservation hint, resources_seen,
    `_complete_one`)."""

    _conn: Any
    claims: Any
    reservation_hint: Any
    resources_seen: Any  # () -> awaitable bool
    _complete_one: Any  # (conn, now, ref, result JSON) -> CompleteResult or the error

    async def in_report(self, then: NextClaim | None) -> bool:
        """Whether `then` runs in its report's transaction (see the module doc)."""
        if then is None or then.max_jobs != 1:
            return False
        return not self.reservation_hint.maybe or await self._admitted(then)

    async def _admitted(self, then: NextClaim) -> bool:
        return admission.needed(then.policy, self.claims.gated) or await self.resources_seen()

    async def _claims_in(self, conn: Any, now: float | None, asks: list[Any]) -> list[Any]:
        """The asks' claims on `conn` (the admission path where limits, aging, per-job
        gates or resources are in play: it takes a job reserved on the worker first)."""
        if not asks or not await self._admitted(asks[0]):
            return list(await self.claims.claim_in(conn, now, asks))
        seen = await self.resources_seen()
        return [await admission.claim(
            conn, a.worker_id, a.lease_s, a.policy,
            None if a.kinds is None else sorted(set(a.kinds)), a.claim_id, now,
            self.reservation_hint, seen) for a in asks]

    async def _complete_next_batch(self, now: float | None, items: list[Any]) -> list[Any]:
        """(ref, result JSON, NextClaim) items of distinct workers: their completes, then
        the next claims of those that succeeded, in one transaction."""
        admitted = await self._admitted(items[0][2])
        async with self._conn() as conn, conn.transaction():
            if not admitted:  # (the admission path's statements keep the planner's choice)
                await conn.execute(SQL_GENERIC_PLANS)
            rows = await conn.fetch(sql.SQL_COMPLETE_BATCH, now, [r.job_id for r, _, _ in items],
                                    [r.worker_id for r, _, _ in items],
                                    [r.token for r, _, _ in items],
                                    [res for _, res, _ in items], *apply.COMPLETE_TEXTS)
            got = {(r[0], r[2]): r[1] for r in rows}
            out: list[Any] = []
            for ref, res, _ in items:
                status = got.get((ref.job_id, ref.worker_id))
                out.append(CompleteResult(status=status) if status is not None
                           else await self._complete_one(conn, now, ref, res))
            done = [i for i, r in enumerate(out) if isinstance(r, CompleteResult)]
            for i, nxt in zip(done, await self._claims_in(
                    conn, now, [items[i][2] for i in done])):
                out[i].next = nxt
            return out

    async def next_in(self, conn: Any, now: float | None, then: NextClaim | None,
                      eager: bool) -> Any:
        """The next claim of a fail or release on its transaction's `conn` (None: not
        asked, or not `eager`: the Coordinator claims after)."""
        if then is None or not eager:
            return None
        return (await self._claims_in(conn, now, [then]))[0]


def worker_of(item: Any) -> str:
    """A complete-with-next item's worker (a worker's two reports never share a
    transaction: its claims are one per worker per statement)."""
    return str(item[0].worker_id)
