"""PostgresStore's admission claim: fleet-wide limits, priority aging, per-job gate overrides
and resource requests, in any combination, decided in Python over rows read in the claim's own
transaction, per candidate in SQLite's order (coordd.store.sqlite.claims._Judge): its gates,
then its resources (coordd.store.postgres.resources), then its limits.

The plain claim (coordd.store.postgres.claims) is one SKIP LOCKED statement; it is used
while none of these is in play. With limits defined, every claim takes one transaction-level
advisory lock first (LIMITS_LOCK_KEY), so the units held, the rate window and the usage it
reads are the last committed ones and no other claim changes them before its commit: that
is what keeps N concurrent claimers within a concurrency of N. Units are released by the
`limit_holds_release` trigger on every lease row that goes
(schema_areas.MIGRATION_LIMITS).
The verdicts are coordd.rules.limits' and coordd.rules.gates' (shared with SQLite); the rule not to
break: every time is the statement's NOW (the database's clock, or the pinned `now`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from coordd.rules import gate_decision
from coordd.rules import gates
from coordd.rules import resources
from coordd.rules import limits as lim
from coordd.rules import transitions as tr
from coordd.rules.claim_policy import ClaimPolicy
from coordd.wire.protocol import ClaimResult
from coordd.store import CLAIM_SCAN, json_decode, lenient_json
from coordd.store.postgres import resources as pgres
from coordd.store.postgres import sql, taken
from coordd.store.postgres.sql import NOW

LIMITS_LOCK_KEY = "coordd-limits"
SCAN = CLAIM_SCAN * 4 + 256  # candidates one claim judges (SQLite: CLAIM_SCAN a level + LIMIT_SCAN)

SQL_LIMITS_LOCK = "SELECT pg_advisory_xact_lock(hashtext($1))"
# $2 roles, $3 kinds (NULL: any), $4 aging_s (0: strict), $5 priorities the worker's gates
# pass (a job with its own gates is judged at any), $6 how many. Order: effective
# priority (aging: one step better per aging_s waited), then queued_at, priority, job id.
# Within a level the oldest age best, so each level is, per role of the worker, an ordered
# walk of the role-led claim index (jobs_claim_role: waiting jobs of other roles are never
# stepped over), merged; only the merge of the levels is sorted.
_EFF = (f"CASE WHEN $4::float8 > 0 THEN greatest(0, j.priority - least(3, floor(greatest(0, "
        f"{NOW} - j.queued_at) / $4::float8))::int) ELSE j.priority END")
_LEVEL = (
    "(SELECT c.* FROM unnest($2::text[]) AS r(role) CROSS JOIN LATERAL "
    f"(SELECT j.job_id, j.priority, j.queued_at, j.gates_json, {_EFF} AS eff, j.kind FROM jobs j "
    f"WHERE j.status = 'waiting' AND j.required_role = r.role AND j.priority = {{p}} "
    f"AND j.run_at <= {NOW} AND ($3::text[] IS NULL OR j.kind = ANY($3::text[])) "
    "AND ({p} = ANY($5::int[]) OR j.gates_json IS NOT NULL) "
    "ORDER BY j.queued_at, j.job_id LIMIT $6) c ORDER BY c.queued_at, c.job_id LIMIT $6)"
)
SQL_CANDIDATES = (
    "SELECT * FROM (" + " UNION ALL ".join(_LEVEL.format(p=p) for p in range(4))
    + ") c ORDER BY eff, queued_at, priority, job_id LIMIT $6"
)
SQL_JOB_LIMITS_OF = "SELECT job_id, name, units FROM job_limits WHERE job_id = ANY($1::text[])"
SQL_HELD = "SELECT coalesce(sum(units), 0)::int FROM limit_holds WHERE name = $1"
SQL_PRUNE_CLAIMS = f"DELETE FROM limit_claims WHERE name = $2 AND at <= {NOW} - $3::float8"
SQL_WINDOW_USED = ("SELECT coalesce(sum(units), 0)::int FROM limit_claims "
                   f"WHERE name = $2 AND at > {NOW} - $3::float8")
SQL_WINDOW_FREES = (  # when the window's oldest claims holding $4 units have left it
    "SELECT at + $3::float8 FROM (SELECT at, sum(units) OVER (ORDER BY at ROWS UNBOUNDED "
    f"PRECEDING) AS run FROM limit_claims WHERE name = $2 AND at > {NOW} - $3::float8) w "
    "WHERE run >= $4 ORDER BY at LIMIT 1"
)
SQL_PRUNE_USAGE = (f"DELETE FROM limit_usage WHERE name = $2 AND metric = $3 "
                   f"AND at <= {NOW} - $4::float8")
SQL_USAGE = ("SELECT coalesce(sum(amount), 0)::float8 FROM limit_usage WHERE name = $2 "
             f"AND metric = $3 AND at > {NOW} - $4::float8")
# the take of one chosen job ($2 job, $3 worker, $4 lease_s, $5 claim_id; $6..$8 its
# resource grant, resources.grant_row): the row as sql.SQL_CLAIM returns it, or none when
# another claim or a cancel got there first. A reservation of the job ends with it.
SQL_TAKE = (
    f"WITH j AS (UPDATE jobs SET status = 'running', attempts = jobs.attempts + 1, "
    f"last_token = jobs.last_token + 1, updated_at = {NOW} "
    "WHERE jobs.job_id = $2 AND jobs.status = 'waiting' RETURNING jobs.*), "
    "d AS (DELETE FROM reservations USING j WHERE reservations.job_id = j.job_id), "
    "l AS (INSERT INTO leases (job_id, worker_id, token, claim_id, granted_at, expires_at, "
    "lease_s, gpu_ids, vram_mb, ram_mb) SELECT job_id, $3, last_token, $5, "
    f"{NOW}, {NOW} + $4::float8, $4::float8, $6, $7, $8 FROM j), "
    "e AS (INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    f"SELECT job_id, {NOW}, $3, 'waiting', 'running', 'claimed (token ' || last_token || ')' "
    "FROM j) "
    f"SELECT {sql.CLAIMED_COLS}, j.last_token, {NOW} + $4::float8, $4::float8 FROM j"
)
SQL_INSERT_HOLDS = (  # $2 job, $3 worker, $4 priority, $5 names, $6 units
    "INSERT INTO limit_holds (name, job_id, units, priority, worker_id, since) "
    f"SELECT n, $2, u, $4, $3, {NOW} FROM unnest($5::text[], $6::int[]) AS x(n, u)"
)
SQL_INSERT_CLAIMS = (  # $2 names, $3 units
    f"INSERT INTO limit_claims (name, at, units) SELECT n, {NOW}, u "
    "FROM unnest($2::text[], $3::int[]) AS x(n, u)"
)
# worker $2's reserved jobs still waiting, of kinds $3 (NULL: any), oldest reservation
# first, as SQL_CANDIDATES' rows
SQL_RESERVED_FOR = (
    "SELECT j.job_id, j.priority, j.queued_at, j.gates_json, j.priority, j.kind "
    "FROM reservations r "
    f"JOIN jobs j ON j.job_id = r.job_id WHERE r.worker_id = $2 AND r.expires_at > {NOW} "
    "AND j.status = 'waiting' AND ($3::text[] IS NULL OR j.kind = ANY($3::text[])) "
    "ORDER BY r.created_at, r.job_id"
)
SQL_RESERVED_LEFT = (  # drop worker $1's reservations whose job no longer waits; any left?
    "WITH d AS (DELETE FROM reservations r USING jobs j WHERE r.worker_id = $1 "
    "AND j.job_id = r.job_id AND j.status <> 'waiting' RETURNING r.job_id) "
    "SELECT EXISTS (SELECT 1 FROM reservations WHERE job_id NOT IN (SELECT job_id FROM d))"
)
SQL_DEAD_LETTER_WAITING = (  # a waiting job whose gate overrides do not decode ($3, $4: texts)
    "WITH u AS (UPDATE jobs SET status = 'failed', attempts = attempts + 1, "
    f"updated_at = {NOW}, finished_at = {NOW}, last_error = $3 "
    "WHERE job_id = $2 AND status = 'waiting' RETURNING job_id) "
    "INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    f"SELECT job_id, {NOW}, NULL, 'waiting', 'failed', $4 FROM u"
)


def needed(policy: ClaimPolicy, gated: bool) -> bool:
    """True when a claim must take this path: limits defined, aging on, or a job with its
    own gates may be waiting (`gated`)."""
    book = policy.limits
    return policy.aging_interval_s > 0 or gated or (book is not None and book.active)


class Readings:
    """One claim's readings of the limits (held units, rate windows, usage), each read
    once, after the limits lock; old window rows are pruned on the way (`prune` False: a
    read-only look, a waiting job's reason)."""

    def __init__(self, conn: Any, now: float | None, prune: bool = True) -> None:
        self.conn, self.now, self._prune = conn, now, prune
        self._held: dict[str, int] = {}
        self._window: dict[str, int] = {}
        self._usage: dict[tuple[str, str], float] = {}

    async def held(self, name: str) -> int:
        if name not in self._held:
            self._held[name] = await self.conn.fetchval(SQL_HELD, name)
        return self._held[name]

    async def window(self, name: str, window_s: float) -> int:
        if name not in self._window:
            if self._prune:
                await self.conn.execute(SQL_PRUNE_CLAIMS, self.now, name, window_s)
            self._window[name] = await self.conn.fetchval(SQL_WINDOW_USED, self.now, name,
                                                          window_s)
        return self._window[name]

    async def usage(self, name: str, metric: str, window_s: float) -> float:
        key = (name, metric)
        if key not in self._usage:
            if self._prune:
                await self.conn.execute(SQL_PRUNE_USAGE, self.now, name, metric, window_s)
            self._usage[key] = await self.conn.fetchval(SQL_USAGE, self.now, name, metric,
                                                        window_s)
        return self._usage[key]


async def limit_detail(r: Readings, book: lim.LimitBook, uses: Sequence[tuple[str, int]],
                       priority: int, t: float) -> tuple[str | None, float | None]:
    """(why the job's limits refuse it or None, when a rate in the way frees a unit)."""
    parts, next_slot = [], None
    for name, units in sorted(uses):
        limit = book.defs.get(name)
        if limit is None:  # no longer defined: holds nothing back
            continue
        excess, free_at = 0, None
        if limit.rate_n:
            excess = lim.rate_excess(limit, await r.window(name, limit.rate_window_s), units,
                                     priority)
            if excess:
                free_at = await r.conn.fetchval(SQL_WINDOW_FREES, r.now, name,
                                                limit.rate_window_s, excess)
                if free_at is not None and (next_slot is None or free_at < next_slot):
                    next_slot = free_at
        used = {m: await r.usage(name, m, b[1]) for m, b in limit.budget.items()}
        held = await r.held(name) if limit.concurrency is not None else 0
        why = lim.refusals(limit, priority, units, held, excess, free_at, used, t)
        if why:
            parts.append(f"limit {name}: " + "; ".join(why))
    return ("; ".join(parts) if parts else None), next_slot


async def claim(conn: Any, worker_id: str, lease_s: float, policy: ClaimPolicy,
                kinds_list: list[str] | None, claim_id: str | None,
                now: float | None, reservations: Any = None,
                resources_seen: bool = False) -> ClaimResult:
    """The best job for the worker, in one transaction: first a job reserved on the worker
    by a preemption (`reservations`: the store's governance.Hint, None: no look) while its
    limits have room, then candidates in effective-priority order (a first page of
    CLAIM_SCAN, then up to SCAN), each judged on its gates (its level's, merged with its
    own overrides), its resources (once a job asked for any: `resources_seen`, or the
    worker names kind defaults) and its limits; the first that passes is taken, its
    grant written on its lease and its units held. With no job, `reasons` and
    `next_slot_s` as on SQLite (coordd.store.sqlite.claims)."""
    bad: list[Any] = []  # taken rows that do not decode: dead-lettered once this commits,
    async with conn.transaction():  # so their workflow is locked before the node (workflows)
        res = await _claim(conn, worker_id, lease_s, policy, kinds_list, claim_id, now,
                           reservations, bad, resources_seen)
    for row in bad:
        await taken.dead_letter(conn, now, row, worker_id)
    return res


async def _claim(conn: Any, worker_id: str, lease_s: float, policy: ClaimPolicy,
                 kinds_list: list[str] | None, claim_id: str | None, now: float | None,
                 reservations: Any, bad: list[Any], resources_seen: bool) -> ClaimResult:
    """`claim`'s body, in its transaction."""
    book = policy.limits if policy.limits is not None and policy.limits.active else None
    if book is not None:
        await conn.execute(SQL_LIMITS_LOCK, LIMITS_LOCK_KEY)
    t, roles_json, hb_json, hb_at = await conn.fetchrow(sql.SQL_CLAIM_WORKER, now,
                                                        worker_id)
    decision = gate_decision.decide(policy, hb_json, hb_at, t)
    if decision.stale is not None:
        detail = (f"worker {worker_id} never sent a heartbeat" if hb_at is None
                  else decision.stale)
        return ClaimResult(reasons=[gates.HEARTBEAT_STALE], detail=detail)
    roles = lenient_json(roles_json, [])
    roles = sorted({x for x in roles if isinstance(x, str)}) if isinstance(roles, list) \
        else []
    walk = _Walk(conn, now, t, policy, book, decision, hb_json, bad)
    if pgres.active(resources_seen, hb_json):
        readings = walk.readings()
        walk.resources = await pgres.ClaimResources.open(
            conn, worker_id, readings if isinstance(readings, dict) else {})
    if reservations is not None and reservations.maybe:
        got = await _reserved(conn, now, walk, reservations, worker_id, lease_s, claim_id,
                              kinds_list)
        if got is not None:
            return got
    seen: set[str] = set()
    for page in (CLAIM_SCAN, SCAN):
        rows = await conn.fetch(SQL_CANDIDATES, now, roles, kinds_list,
                                float(policy.aging_interval_s), decision.allowed, page)
        got = await walk.take_first([r for r in rows if r[0] not in seen], worker_id,
                                    lease_s, claim_id)
        if got is not None:
            return got
        seen.update(r[0] for r in rows)
        if len(rows) < page:
            break
    waiting = [p for (p,) in await conn.fetch(sql.SQL_GATED_PRIORITIES, now, roles,
                                              kinds_list, decision.allowed)] \
        if decision.refused else []
    reasons = {**decision.reasons(waiting), **walk.reasons}
    if not reasons and await conn.fetchval(sql.SQL_ANY_RUNNABLE, now) is not None:
        reasons[gates.NO_MATCHING_ROLE] = ("no runnable job needs one of this worker's "
                                           "roles" + (" and kinds" if kinds_list else ""))
    res = ClaimResult(reasons=list(reasons), detail="; ".join(reasons.values()))
    if walk.next_slot is not None:
        res.next_slot_s = max(0.0, walk.next_slot - t)
    return res


async def _reserved(conn: Any, now: float | None, walk: _Walk, hint: Any, worker_id: str,
                    lease_s: float, claim_id: str | None, kinds_list: list[str] | None
                    ) -> ClaimResult | None:
    """The job reserved on `worker_id` (of one of the claim's kinds), taken (its
    reservation gone, its units held) while its limits have room, as SQLite's claim does
    (gates not judged: the victim's slot is promised to it); while the victim's resources
    are not free yet, a refusal that gives nobody else anything either. None otherwise,
    the hint lowered when no reservation is left."""
    epoch = hint.epoch
    rows = await conn.fetch(SQL_RESERVED_FOR, now, worker_id, kinds_list)
    if rows:
        return await walk.take_first(list(rows), worker_id, lease_s, claim_id,
                                     reserved=True)
    if not await conn.fetchval(SQL_RESERVED_LEFT, worker_id) and hint.epoch == epoch:
        hint.maybe = False
    return None


class _Walk:
    """One admission claim's judging of candidates: refusals gathered in `reasons` (the
    first detail per code), the earliest rate slot in `next_slot`; `resources` the
    claim's resource step (None: no job asks and the worker names no defaults)."""

    def __init__(self, conn: Any, now: float | None, t: float, policy: ClaimPolicy,
                 book: lim.LimitBook | None, decision: gate_decision.GateDecision,
                 heartbeat_json: str, bad: list[Any]) -> None:
        self.conn, self.now, self.t, self.policy, self.book = conn, now, t, policy, book
        self.bad = bad  # taken rows that do not decode (claim dead-letters them)
        self.decision, self._heartbeat_json = decision, heartbeat_json
        self._readings: Any = None
        self.limits = Readings(conn, now)
        self.resources: pgres.ClaimResources | None = None
        self.reasons: dict[str, str] = {}
        self.next_slot: float | None = None

    def readings(self) -> Any:
        """The worker's stored readings, decoded on first use."""
        if self._readings is None:
            self._readings = lenient_json(self._heartbeat_json, {})
        return self._readings

    async def take_first(self, rows: list[Any], worker_id: str, lease_s: float,
                         claim_id: str | None, reserved: bool = False
                         ) -> ClaimResult | None:
        """Take the first of `rows` that passes (None: none did). `reserved`: rows of
        reservations on this worker, judged on their limits, then resources (a shortfall
        refuses the claim), not on their gates."""
        uses: dict[str, list[tuple[str, int]]] = {}
        if self.book is not None and rows:
            for job_id, name, units in await self.conn.fetch(SQL_JOB_LIMITS_OF,
                                                             [r[0] for r in rows]):
                uses.setdefault(job_id, []).append((name, units))
        res = self.resources
        if res is not None:
            await res.learn([(r[0], r[5]) for r in rows])
        for job_id, prio, _queued_at, gates_json, _eff, _kind in rows:
            job_uses = uses.get(job_id, [])
            if reserved:
                if not await self._limits_pass(job_uses, prio):
                    continue
                short = res.admit(job_id) if res is not None else None
                if short is not None:  # the victim's GPU memory is not free yet
                    return ClaimResult(reasons=[resources.RESOURCES],
                                       detail=f"reserved for job {job_id}: {short}")
            else:
                if not await self._gates_pass(job_id, prio, gates_json):
                    continue
                short = res.admit(job_id, prio) if res is not None else None
                if short is not None:
                    self.reasons.setdefault(resources.RESOURCES, short)
                    continue
                if not await self._limits_pass(job_uses, prio):
                    continue
            got = await self._take(job_id, worker_id, lease_s, claim_id, prio, job_uses)
            if got is not None:
                return got
        return None

    async def _limits_pass(self, job_uses: list[tuple[str, int]], prio: int) -> bool:
        """Whether the job's limits have room (always, with none defined or named)."""
        if not job_uses or self.book is None:
            return True
        why, slot = await limit_detail(self.limits, self.book, job_uses, prio, self.t)
        if slot is not None and (self.next_slot is None or slot < self.next_slot):
            self.next_slot = slot
        if why is not None:
            self.reasons.setdefault(lim.LIMIT_REFUSED, why)
            return False
        return True

    async def _take(self, job_id: str, worker_id: str, lease_s: float,
                    claim_id: str | None, prio: int, job_uses: list[tuple[str, int]]
                    ) -> ClaimResult | None:
        """Take the job under a new lease with its grant and hold its units; None when
        another claim or a cancel got there first, or its data does not decode (the row
        kept in `bad`)."""
        grant = self.resources.grants.get(job_id) if self.resources is not None else None
        row = await self.conn.fetchrow(SQL_TAKE, self.now, job_id, worker_id, lease_s,
                                       claim_id, *pgres.grant_row(grant))
        if row is None:  # taken or cancelled meanwhile
            return None
        try:
            got = taken.claimed(row)
        except taken.Undecodable:
            self.bad.append(row)
            return None
        await _hold(self.conn, self.now, self.book, job_id, worker_id, prio, job_uses)
        if grant is not None and got.job is not None:
            got.job.gpu_ids = list(grant.gpu_ids) or None
        return got

    async def _gates_pass(self, job_id: str, prio: int, gates_json: str | None) -> bool:
        """The job's gates on the worker's readings; a job whose own gates do not decode
        is dead-lettered (coordd.rules.transitions.dead_letter)."""
        if gates_json is None:
            refused = self.decision.refused.get(prio, [])
        else:
            try:
                refused = gates.evaluate(gates.merge(self.policy.policies[prio],
                                                     json_decode(gates_json)), self.readings())
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                d = tr.dead_letter(tr.WAITING, gates.GATES_DECODE_ERROR, str(exc))
                await self.conn.execute(SQL_DEAD_LETTER_WAITING, self.now, job_id,
                                        d.last_error, d.reason)
                return False
        for code, detail in refused:
            self.reasons.setdefault(code, detail)
        return not refused


async def _hold(conn: Any, now: float | None, book: lim.LimitBook | None, job_id: str,
                worker_id: str, prio: int, uses: list[tuple[str, int]]) -> None:
    """Hold the units of the job just taken (its lease row is in), and use its rates."""
    if not uses:
        return
    names, units = [n for n, _ in uses], [u for _, u in uses]
    await conn.execute(SQL_INSERT_HOLDS, now, job_id, worker_id, prio, names, units)
    rated = [(n, u) for n, u in uses
             if book is not None and n in book.defs and book.defs[n].rate_n]
    if rated:
        await conn.execute(SQL_INSERT_CLAIMS, now, [n for n, _ in rated],
                           [u for _, u in rated])
