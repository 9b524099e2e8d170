"""PostgresStore's reports with their next claim in one transaction (eager dispatch:
`then`, a coordd.rules.claim_batch.NextClaim, on complete, fail and release).

The rule, as on SQLite: the report and its next claim commit together or not at all, so
a worker whose report is stored also holds the job it was handed (one commit per job, not
two), and a claim id that already holds a live lease answers that lease. Completes with a
next claim are batched like plain completes. On the plain path (no limits, aging, per-job
gates, resources or reservations; the worker's gate decision known) the completes of one
claim group and their claims are ONE statement (coordd.store.postgres.eager_sql): one round
trip. What that statement leaves (a refused complete, a workflow node, a result schema, a
decision that no longer stands), and every other case, runs in a transaction: one complete
statement for the lot and one claim statement per claim group
(coordd.store.postgres.claims.Claims.claim_in), or the admission path
(coordd.store.postgres.admission). A statement or transaction that fails is run again
item by item (coordd.store.postgres.batch.each), so one bad item fails only its report.
A next claim of more than one job, or one that may find a reservation outside the
admission path, is not run here: `next` stays None and the Coordinator claims after the
report (coordd.service.dispatch).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from coordd import errors
from coordd.rules.claim_batch import NextClaim
from coordd.wire.protocol import CompleteResult
from coordd.store.postgres import admission, apply, batch, claims, eager_sql, sql
from coordd.store.postgres import resources as pgres
from coordd.store.postgres.fence import Raced, refusal
from coordd.store.postgres.taken import Undecodable, claimed, dead_letter

logger = logging.getLogger(__name__)

# one statement at a time: the completes that arrive meanwhile share the next one (group
# commit, as SQLite's one writer); two at a time made smaller batches and a slower drain
# at 16 clients on a 2-core machine (docs/decisions.md, pgone)
EAGER_IN_FLIGHT_DEFAULT = 1


class EagerPostgres:
    """Mixed into PostgresStore (its `_conn`, claims, reservation hint, resources_seen,
    `_complete_one`)."""

    _conn: Any
    claims: Any
    reservation_hint: Any
    resources_seen: Any  # () -> awaitable bool
    _complete_one: Any  # (conn, now, ref, result JSON) -> CompleteResult or the error

    eager_paths: dict[str, int]  # completes with `then` per path (tests, benchmarks)

    async def in_report(self, then: NextClaim | None) -> bool:
        """Whether `then` runs in its report's transaction (see the module doc)."""
        if then is None or then.max_jobs != 1:
            return False
        return not self.reservation_hint.maybe or await self._admitted(then)

    async def _admitted(self, then: NextClaim) -> bool:
        return admission.needed(then.policy, self.claims.gated) or await self.resources_seen()

    async def _claims_in(self, conn: Any, now: float | None, asks: list[Any]) -> list[Any]:
        """The asks' claims on `conn`, inside its transaction: a claim id's live lease
        where it has one, else a new claim (the admission path where limits, aging,
        per-job gates or resources are in play: it takes a job reserved on the worker
        first)."""
        out = await self.claims.replays(conn, now, asks)
        todo = [i for i, r in enumerate(out) if r is None]
        if not todo:
            return out
        new = [asks[i] for i in todo]
        if not await self._admitted(new[0]):
            got = list(await self.claims.claim_in(conn, now, new))
        else:
            seen = await self.resources_seen()
            got = [await admission.claim(
                conn, a.worker_id, a.lease_s, a.policy,
                None if a.kinds is None else sorted(set(a.kinds)), a.claim_id, now,
                self.reservation_hint, seen) for a in new]
        for i, res in zip(todo, got):
            out[i] = res
        return out

    async def _complete_next_batch(self, now: float | None, items: list[Any]) -> list[Any]:
        """(ref, result JSON, NextClaim) items of distinct workers: each complete with
        the next claim of those that succeeded; a result or an error per item."""
        out: list[Any] = [None] * len(items)
        if not await self._admitted(items[0][2]):
            asks = [self.claims.seen_item(then) for _, _, then in items]
            for idx in claims.groups_of(asks).values():
                part = [(*items[i], asks[i]) for i in idx]
                for i, res in zip(idx, await batch.each(self._in_statement, now, part)):
                    out[i] = res
        rest = [i for i, res in enumerate(out) if res is None]
        self.eager_paths["statement"] += len(items) - len(rest)
        self.eager_paths["transaction"] += len(rest)
        if rest:
            for i, res in zip(rest, await batch.each(self._in_transaction, now,
                                                     [items[i] for i in rest])):
                out[i] = res
        return out

    async def _in_statement(self, now: float | None, items: list[Any]) -> list[Any]:
        """(ref, result, NextClaim, claim item) items of one claim group in one statement
        (eager_sql): a result or an error per item, None where the statement did not
        complete it and the fence does not refuse it (then: the transaction path)."""
        try:
            async with self._conn() as conn:
                rows = await self._complete_next_rows(conn, now, items)
        except errors.BadRequest as exc:  # (nothing stored: one statement)
            if len(items) == 1 and claims.claim_id_taken(exc):  # its claim id's twin,
                return [None]  # committed meanwhile: the transaction path replays it
            raise
        return [await self._after(now, item, row) for item, row in zip(items, rows)]

    async def _after(self, now: float | None, item: Any, row: Any) -> Any:
        """An item's result from its row; never raises (the statement has committed)."""
        ref, _, _, (_, _, _, kinds_list, seen) = item
        if row is None:  # nothing of it stored
            try:
                async with self._conn() as conn:
                    err = await refusal(conn, now, ref)
            except Exception as exc:  # (this report's error only)
                return exc
            return None if isinstance(err, Raced) else err
        res = CompleteResult(status=row[0])
        taken, replayed = tuple(row)[1:12], row[12]
        if taken[0] is not None and not replayed:
            with contextlib.suppress(Undecodable):
                res.next = claimed(taken)  # the common case: a new lease, nothing to read
                return res
        try:
            async with self._conn() as conn:
                res.next = await self._next_of(conn, now, ref.worker_id, taken, replayed,
                                               seen, kinds_list)
        except Exception as exc:  # the report is stored: the Coordinator claims after
            logger.warning("next claim of %s's report not told: %s", ref.worker_id, exc,
                           extra={"action": "claim_next_failed", "worker_id": ref.worker_id})
        return res

    async def _complete_next_rows(self, conn: Any, now: float | None,
                                  items: list[Any]) -> list[Any]:
        """The statement's row per item (None: not completed)."""
        _w, _c, lease_s, kinds_list, seen = items[0][3]
        claim = (lease_s, seen.decision.allowed, seen.roles, kinds_list,
                 seen.policy.heartbeat_stale_s)
        if len(items) == 1:
            ref, res, _, (wid, cid, _, _, _) = items[0]
            row = await conn.fetchrow(
                eager_sql.complete_next_sql(seen.roles), now, wid, claim[0], cid, *claim[1:],
                *seen.heartbeat, ref.job_id, ref.token, *apply.COMPLETE_TEXTS, res)
            return [row]
        heartbeats = [item[4].heartbeat for _, _, _, item in items]
        rows = await conn.fetch(
            eager_sql.complete_next_sql(seen.roles, batch=True), now,
            [i[0].worker_id for i in items], claim[0], [i[3][1] for i in items], *claim[1:],
            *[[h[k] for h in heartbeats] for k in range(3)],
            [i[0].job_id for i in items], [i[0].token for i in items],
            *apply.COMPLETE_TEXTS, [i[1] for i in items])
        got = {r[0]: (r[1], *tuple(r)[3:]) for r in rows}  # (r[2]: x's worker again)
        return [got.get(i[0].worker_id) for i in items]

    async def _next_of(self, conn: Any, now: float | None, worker_id: str,
                       taken: tuple[Any, ...], replayed: bool, seen: Any,
                       kinds_list: list[str] | None) -> Any:
        """A completed item's next claim other than a new lease that decodes: the lease
        replayed, or no job and why (None: the job taken does not decode, dead-lettered:
        the Coordinator claims after)."""
        if taken[0] is None:
            return await self.claims.refused(conn, now, seen.decision, seen.roles, kinds_list)
        try:
            got = claimed(taken)
        except Undecodable:
            await dead_letter(conn, now, taken, worker_id)
            return None
        return await pgres.with_gpus(conn, got) if replayed else got

    async def _in_transaction(self, now: float | None, items: list[Any]) -> list[Any]:
        """(ref, result JSON, NextClaim) items: their completes, then the next claims of
        those that succeeded, in one transaction."""
        async with self._conn() as conn, conn.transaction():
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
