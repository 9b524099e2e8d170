"""PostgresStore's claim: gates decided in Python from the worker's last heartbeat
(coordd.rules.gate_decision), the job taken by one SKIP LOCKED statement on the database clock.

A worker's decision is remembered with the heartbeat (at, readings, roles) it was made
from; the next claim sends that heartbeat along and the statement takes a job only if it
is still the worker's last, so a claim is one round trip while the readings stand, and
claims of workers sharing a decision are batched into one statement (sql.SQL_CLAIM_BATCH).
When that finds nothing, the full path reads the worker, decides again and says why not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import asyncpg
import msgspec

from coordd import errors
from coordd.rules import gate_decision
from coordd.rules import gates
from coordd.rules.claim_policy import ClaimPolicy
from coordd.wire.protocol import ClaimResult
from coordd.store import lenient_json
from coordd.store.postgres import admission, batch, sql
from coordd.store.postgres import resources as pgres
from coordd.store.postgres.taken import Undecodable, claimed, dead_letter

SEEN_WORKERS_MAX = 4096  # gate decisions remembered (one per worker) before starting over


class Seen(msgspec.Struct):
    """A worker's gate decision and the heartbeat (at, readings JSON, roles JSON) it was
    made from."""

    policy: ClaimPolicy
    decision: gate_decision.GateDecision
    roles: list[str]
    heartbeat: tuple[float, str, str]


class Claims:
    """Claims for one PostgresStore.

    Args:
        conn: the store's connection context (`async with conn() as c`).
        max_items, max_in_flight: the claim batcher's bounds (coordd.store.postgres.batch).
    """

    def __init__(self, conn: Any, *, max_items: int = batch.MAX_ITEMS_DEFAULT,
                 max_in_flight: int = batch.MAX_IN_FLIGHT_DEFAULT) -> None:
        self._conn = conn
        self._seen: dict[str, Seen] = {}
        self.gated = False  # a job with its own gates may wait (set by the store)
        self.batcher = batch.Batcher(self._claim_batch, _worker_of, group=_group_of,
                                     max_items=max_items, max_in_flight=max_in_flight)

    async def claim(self, worker_id: str, lease_s: float, policy: ClaimPolicy,
                    kinds: Sequence[str] | None, claim_id: str | None,
                    now: float | None, reservations: Any = None,
                    resources_seen: bool = False) -> ClaimResult:
        """See PostgresStore.claim. A repeated `claim_id` is not looked up first: its lease
        row's unique index (leases_claim_id) refuses the new lease, the statement changes
        nothing, and the lease it granted is looked up then (one round trip per claim, not
        two). A connection lost under the statement (it may have committed) looks the
        `claim_id` up once on another the same way: the lease it granted, if any, is the
        answer, never left to the reaper. With limits, aging, per-job gates or
        resources in play (`resources_seen`: a job asked; or the worker's heartbeat names
        kind defaults), the admission path (coordd.store.postgres.admission), which takes
        a job reserved on the worker first (`reservations`: the store's reservation hint).
        Raises: errors.Unavailable."""
        try:
            return await self._claim(worker_id, lease_s, policy, kinds, claim_id, now,
                                     reservations, resources_seen)
        except (errors.Unavailable, errors.BadRequest) as exc:
            if claim_id is None or (isinstance(exc, errors.BadRequest)
                                    and not claim_id_taken(exc)):
                raise
            async with self._conn() as conn:
                row = await conn.fetchrow(sql.SQL_CLAIM_REPLAY, now, worker_id, claim_id)
                if row is not None:
                    return await pgres.with_gpus(conn, claimed(row))
            raise

    async def _claim(self, worker_id: str, lease_s: float, policy: ClaimPolicy,
                     kinds: Sequence[str] | None, claim_id: str | None,
                     now: float | None, reservations: Any, resources_seen: bool
                     ) -> ClaimResult:
        kinds_list = None if kinds is None else sorted(set(kinds))
        if admission.needed(policy, self.gated) or resources_seen:
            async with self._conn() as conn:
                return await admission.claim(conn, worker_id, lease_s, policy, kinds_list,
                                             claim_id, now, reservations, resources_seen)
        seen = self._seen.get(worker_id)
        if seen is not None and seen.policy is policy and seen.decision.allowed:
            row = await self.batcher.submit(now, (worker_id, claim_id, lease_s, kinds_list, seen))
            if row is not None:
                with contextlib.suppress(Undecodable):
                    return claimed(row)
                async with self._conn() as conn:
                    await dead_letter(conn, now, row, worker_id)
        async with self._conn() as conn:
            return await self._full(conn, worker_id, lease_s, policy, kinds_list, claim_id, now)

    async def claim_in(self, conn: Any, now: float | None, asks: list[Any]) -> list[Any]:
        """One claim for each of `asks` (NextClaims of distinct workers, each taking one
        job, no limits, aging, per-job gates or resources in play) on `conn`, inside its
        transaction: the asks whose worker's gate decision is known share one statement
        per claim group, as batched claims do; the others (or those it found nothing
        for) take the full path. A ClaimResult per ask, in order."""
        out: list[Any] = [None] * len(asks)
        items = [self.seen_item(a) for a in asks]
        for idx in groups_of(items).values():
            for i, row in zip(idx, await self._claim_rows(conn, now, [items[i] for i in idx])):
                if row is None:
                    continue
                with contextlib.suppress(Undecodable):
                    out[i] = claimed(row)
                    continue
                await dead_letter(conn, now, row, asks[i].worker_id)
        for i, a in enumerate(asks):
            if out[i] is None:
                out[i] = await self._full(conn, a.worker_id, a.lease_s, a.policy,
                                          None if a.kinds is None else sorted(set(a.kinds)),
                                          a.claim_id, now)
        return out

    def seen_item(self, ask: Any) -> tuple[Any, ...] | None:
        """A claim item (worker, claim id, lease_s, kinds, Seen) for a NextClaim whose
        worker's gate decision is known and lets it claim at some priority; else None."""
        seen = self._seen.get(ask.worker_id)
        if seen is None or seen.policy is not ask.policy or not seen.decision.allowed:
            return None
        kinds = None if ask.kinds is None else sorted(set(ask.kinds))
        return (ask.worker_id, ask.claim_id, ask.lease_s, kinds, seen)

    async def replays(self, conn: Any, now: float | None, asks: list[Any]) -> list[Any]:
        """For each ask (NextClaims of distinct workers), the live lease its claim id
        already granted (a ClaimResult), else None; one statement for the lot."""
        ids = [(a.worker_id, a.claim_id) for a in asks if a.claim_id is not None]
        if not ids:
            return [None] * len(asks)
        rows = await conn.fetch(sql.SQL_CLAIM_REPLAYS, now, [w for w, _ in ids],
                                [c for _, c in ids])
        got = {r[-1]: r[:-1] for r in rows}
        return [None if a.worker_id not in got
                else await pgres.with_gpus(conn, claimed(got[a.worker_id])) for a in asks]

    async def _full(self, conn: Any, worker_id: str, lease_s: float, policy: ClaimPolicy,
                    kinds_list: list[str] | None, claim_id: str | None,
                    now: float | None) -> ClaimResult:
        """Read the worker, decide its gates, claim; with no job, say why."""
        t, roles_json, hb_json, hb_at = await conn.fetchrow(sql.SQL_CLAIM_WORKER, now, worker_id)
        decision = gate_decision.decide(policy, hb_json, hb_at, t)
        if decision.stale is not None:
            detail = (f"worker {worker_id} never sent a heartbeat" if hb_at is None
                      else decision.stale)
            return ClaimResult(reasons=[gates.HEARTBEAT_STALE], detail=detail)
        if pgres.active(False, hb_json or ""):  # the worker names kind defaults: admit
            return await admission.claim(conn, worker_id, lease_s, policy, kinds_list,
                                         claim_id, now, None, False)
        roles = lenient_json(roles_json, [])
        roles = sorted({r for r in roles if isinstance(r, str)}) if isinstance(roles, list) else []
        if len(self._seen) >= SEEN_WORKERS_MAX:
            self._seen.clear()
        self._seen[worker_id] = Seen(policy, decision, roles, (hb_at, hb_json, roles_json))
        while decision.allowed:
            row = await conn.fetchrow(sql.claim_sql(roles), now, worker_id, lease_s, claim_id,
                                      decision.allowed, roles, kinds_list,
                                      policy.heartbeat_stale_s, None, None, None)
            if row is None:
                break
            with contextlib.suppress(Undecodable):
                return claimed(row)
            await dead_letter(conn, now, row, worker_id)
        return await self.refused(conn, now, decision, roles, kinds_list)

    async def refused(self, conn: Any, now: float | None,
                      decision: gate_decision.GateDecision, roles: list[str],
                      kinds_list: list[str] | None) -> ClaimResult:
        """No job under `decision` for a worker of `roles`: the reasons why (reads only)."""
        refused = [p for (p,) in await conn.fetch(sql.SQL_GATED_PRIORITIES, now, roles,
                                                  kinds_list, decision.allowed)] \
            if decision.refused else []
        reasons = decision.reasons(refused)
        if not reasons and await conn.fetchval(sql.SQL_ANY_RUNNABLE, now) is not None:
            reasons[gates.NO_MATCHING_ROLE] = ("no runnable job needs one of this worker's "
                                               "roles" + (" and kinds" if kinds_list else ""))
        return ClaimResult(reasons=list(reasons), detail="; ".join(reasons.values()))

    async def _claim_batch(self, now: float | None, items: list[Any]) -> list[Any]:
        """One statement for claims sharing their parameters: a row per worker served,
        None for the others (they take the full path)."""
        async with self._conn() as conn:
            return await self._claim_rows(conn, now, items)

    async def _claim_rows(self, conn: Any, now: float | None, items: list[Any]) -> list[Any]:
        """The claim statement for `items` (one claim group) on `conn`: a lone item the
        one-worker statement (a cheaper plan than the batch's for one row), else the
        batch's."""
        wid, cid, lease_s, kinds_list, seen = items[0]
        if len(items) == 1:
            row = await conn.fetchrow(sql.claim_sql(seen.roles), now, wid, lease_s, cid,
                                      seen.decision.allowed, seen.roles, kinds_list,
                                      seen.policy.heartbeat_stale_s, *seen.heartbeat)
            return [None if row is None else tuple(row)]
        rows = await conn.fetch(
            sql.claim_sql(seen.roles, batch=True), now, [i[0] for i in items], lease_s,
            [i[1] for i in items],
            seen.decision.allowed, seen.roles, kinds_list, seen.policy.heartbeat_stale_s,
            *[[i[4].heartbeat[k] for i in items] for k in range(3)])
        got = {r[-1]: tuple(r)[:-1] for r in rows}
        return [got.get(i[0]) for i in items]


def claim_id_taken(exc: errors.BadRequest) -> bool:
    """The refusal came from leases_claim_id: this worker's claim id has a lease."""
    cause = exc.__cause__
    return isinstance(cause, asyncpg.UniqueViolationError) and \
        getattr(cause, "constraint_name", None) == "leases_claim_id"


def _worker_of(item: Any) -> str:
    return item[0]


def groups_of(items: list[Any]) -> dict[Any, list[int]]:
    """The indexes of `items` (claim items, or None: skipped) by claim group."""
    groups: dict[Any, list[int]] = {}
    for i, item in enumerate(items):
        if item is not None:
            groups.setdefault(_group_of(item), []).append(i)
    return groups


def _group_of(item: Any) -> Any:
    _w, _c, lease_s, kinds_list, seen = item
    return (lease_s, tuple(kinds_list or ()) if kinds_list is not None else None,
            tuple(seen.decision.allowed), tuple(seen.roles), seen.policy.heartbeat_stale_s,
            id(seen.policy))
