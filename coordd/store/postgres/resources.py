"""PostgresStore's resource admission (coordd.resources decides, coordd.admission walks):
a job's request (`job_resources`), what a lease was granted (on the lease row), and the
claim that admits. Every statement of it is here.

While no job ever asked for resources, claims take the batched SKIP LOCKED path of
coordd.store.postgres.claims and nothing here runs. Once one did (`resources_seen`:
an enqueue with a request, or a request found in the database), every claim of this
store is `admitted_claim`: one transaction that locks the best candidates in claim order
(SKIP LOCKED), admits them one by one with coordd.admission.Admission (the SQLite claim's
rules: best-fit GPUs, capacity held back for a higher priority) and takes the first that
fits, its grant written on its new lease in the same statement.
"""

from __future__ import annotations

from typing import Any

import msgspec

from coordd import admission, gate_decision, gates, resources
from coordd.claims import ClaimPolicy
from coordd.protocol import ClaimResult
from coordd.resources import Grant, Request
from coordd.store import CLAIM_SCAN, lenient_json
from coordd.store.postgres import claims, sql
from coordd.store.postgres.sql import NOW

WALK_MAX = CLAIM_SCAN * 4  # candidates one admitted claim locks and looks at

SQL_INSERT_REQUESTS = (  # $1 job ids, $2 gpus, $3 vram_mb, $4 ram_mb
    "INSERT INTO job_resources (job_id, gpus, vram_mb, ram_mb) "
    "SELECT * FROM unnest($1::text[], $2::int[], $3::int[], $4::int[]) "
    "ON CONFLICT (job_id) DO NOTHING"
)
SQL_ANY_REQUEST = "SELECT EXISTS (SELECT 1 FROM job_resources)"
SQL_REQUESTS_OF = (
    "SELECT job_id, gpus, vram_mb, ram_mb FROM job_resources WHERE job_id = ANY($1::text[])"
)
_GRANTED = "(gpu_ids IS NOT NULL OR ram_mb IS NOT NULL)"
SQL_HELD_GRANTS = f"SELECT gpu_ids, vram_mb, ram_mb FROM leases WHERE worker_id = $1 AND {_GRANTED}"
SQL_ALL_GRANTS = (
    f"SELECT worker_id, job_id, gpu_ids, vram_mb, ram_mb FROM leases WHERE {_GRANTED}"
)
SQL_RESERVED_REQUESTS = (
    "SELECT r.worker_id, q.gpus, q.vram_mb, q.ram_mb FROM reservations r "
    "JOIN job_resources q ON q.job_id = r.job_id JOIN jobs j ON j.job_id = r.job_id "
    "WHERE j.status = 'waiting'"
)
SQL_RESERVED_FOR = (  # worker $2's live reservation whose job waits, locked
    "SELECT j.job_id, j.priority FROM reservations r JOIN jobs j ON j.job_id = r.job_id "
    f"WHERE r.worker_id = $2 AND r.expires_at > {NOW} AND j.status = 'waiting' "
    "ORDER BY r.created_at, r.job_id LIMIT 1 FOR UPDATE OF j SKIP LOCKED"
)
# $2 allowed priorities, $3 roles, $4 kinds (NULL: any), $5 limit: the candidates in claim
# order, locked (those another claim holds are skipped), with their requests
SQL_WALK = (
    "SELECT j.job_id, j.priority, j.kind, q.gpus, q.vram_mb, q.ram_mb FROM jobs j "
    "LEFT JOIN job_resources q ON q.job_id = j.job_id WHERE j.status = 'waiting' "
    f"AND j.run_at <= {NOW} AND j.priority = ANY($2::int[]) "
    "AND j.required_role = ANY($3::text[]) AND ($4::text[] IS NULL OR j.kind = ANY($4::text[])) "
    "AND j.gates_json IS NULL ORDER BY j.priority, j.queued_at, j.job_id LIMIT $5 "
    "FOR UPDATE OF j SKIP LOCKED"
)
# Take the locked job $2 for worker $3 ($4 lease_s, $5 claim_id; $6..$8 the grant): as
# sql.SQL_CLAIM's take; its reservation, if any, ends with it.
SQL_TAKE = (
    "WITH j AS (UPDATE jobs SET status = 'running', attempts = jobs.attempts + 1, "
    f"last_token = jobs.last_token + 1, updated_at = {NOW} "
    "WHERE jobs.job_id = $2 AND jobs.status = 'waiting' RETURNING jobs.*), "
    "d AS (DELETE FROM reservations USING j WHERE reservations.job_id = j.job_id), "
    "l AS (INSERT INTO leases (job_id, worker_id, token, claim_id, granted_at, expires_at, "
    f"lease_s, gpu_ids, vram_mb, ram_mb) SELECT job_id, $3, last_token, $5, {NOW}, "
    f"{NOW} + $4::float8, $4::float8, $6, $7, $8 FROM j), "
    "e AS (INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    f"SELECT job_id, {NOW}, $3, 'waiting', 'running', 'claimed (token ' || last_token || ')' "
    "FROM j) "
    "SELECT j.job_id, j.kind, j.required_role, j.priority, j.payload_json, j.attempts, "
    f"j.checkpoint_json, j.max_runtime_s, j.last_token, {NOW} + $4::float8, $4::float8 FROM j"
)
SQL_GRANT_OF = "SELECT gpu_ids, vram_mb, ram_mb FROM leases WHERE job_id = $1 AND " + _GRANTED
SQL_REQUEST_OF = "SELECT gpus, vram_mb, ram_mb FROM job_resources WHERE job_id = $1"


class _Admission(admission.Admission):
    """coordd.admission.Admission over rows read beforehand: the candidates' requests
    and the worker's held grants (no connection)."""

    def __init__(self, worker_id: str, readings: dict[str, Any], held: list[Grant],
                 requests: dict[str, Request], kinds: dict[str, str] | None = None) -> None:
        super().__init__(None, worker_id, readings)  # type: ignore[arg-type]
        self._held, self._requests, self._kinds = held, requests, kinds or {}

    def request(self, job_id: str) -> Request | None:
        """The job's own request, else its kind's default on this worker."""
        req = self._requests.get(job_id)
        if req is None and self._defaults:
            req = self._defaults.get(self._kinds.get(job_id, ""))
        return req


def grant_row(grant: Grant | None) -> tuple[Any, Any, Any]:
    """(gpu_ids JSON or None, vram_mb, ram_mb) as a lease row stores a grant."""
    if grant is None:
        return None, None, None
    ids = msgspec.json.encode(list(grant.gpu_ids)).decode() if grant.gpu_ids else None
    return ids, grant.vram_mb, grant.ram_mb


def grant_of(gpu_ids: str | None, vram_mb: int | None, ram_mb: int | None) -> Grant:
    """A Grant from a lease row's columns."""
    ids = tuple(int(i) for i in msgspec.json.decode(gpu_ids)) if gpu_ids else ()
    return Grant(gpu_ids=ids, vram_mb=vram_mb or 0, ram_mb=ram_mb or 0)


class ResourcesPostgres:
    """Mixed into PostgresStore (its `_conn`, `reservation_hint`)."""

    _conn: Any
    _resources_seen: bool | None = None  # None: not looked yet

    async def resources_seen(self) -> bool:
        """Whether any job ever asked for resources (looked up once, then kept)."""
        if self._resources_seen is None:
            async with self._conn() as conn:
                self._resources_seen = bool(await conn.fetchval(SQL_ANY_REQUEST))
        return self._resources_seen

    async def store_requests(self, conn: Any, jobs: list[Any]) -> None:
        """Store the requests of new jobs (in the enqueue's transaction); from then on
        every claim admits."""
        asking = [j for j in jobs if j.resources is not None]
        if not asking:
            return
        self._resources_seen = True
        await conn.execute(SQL_INSERT_REQUESTS, [j.job_id for j in asking],
                           [j.resources.gpus for j in asking],
                           [j.resources.vram_mb for j in asking],
                           [j.resources.ram_mb for j in asking])

    async def admitted_claim(self, worker_id: str, lease_s: float, policy: ClaimPolicy,
                             kinds: Any, claim_id: str | None,
                             now: float | None) -> ClaimResult:
        """The claim while requests exist (see the module docstring): a live reservation
        on this worker first, then the candidates in claim order; with none admitted,
        the reasons (`resources` with what is short, the gates' codes, ...)."""
        kinds = None if kinds is None else sorted(set(kinds))
        async with self._conn() as conn:
            if claim_id is not None:
                row = await conn.fetchrow(sql.SQL_CLAIM_REPLAY, now, worker_id, claim_id)
                if row is not None:
                    return await _with_gpus(conn, claims.claimed(row))
            while True:
                bad: list[Any] = []  # taken rows that do not decode: dead-lettered after
                async with conn.transaction():  # the commit, in the workflow-then-node order
                    got = await self._admit_once(conn, worker_id, lease_s, policy, kinds,
                                                 claim_id, now, bad)
                for row in bad:
                    await claims.dead_letter(conn, now, row, worker_id)
                if got is not None:
                    return got

    async def _admit_once(self, conn: Any, worker_id: str, lease_s: float,
                          policy: ClaimPolicy, kinds: list[str] | None,
                          claim_id: str | None, now: float | None,
                          bad: list[Any]) -> ClaimResult | None:
        """One try; None when the job taken does not decode (its row put in `bad`)."""
        t, roles_json, hb_json, hb_at = await conn.fetchrow(sql.SQL_CLAIM_WORKER, now, worker_id)
        decision = gate_decision.decide(policy, hb_json, hb_at, t)
        if decision.stale is not None:
            detail = (f"worker {worker_id} never sent a heartbeat" if hb_at is None
                      else decision.stale)
            return ClaimResult(reasons=[gates.HEARTBEAT_STALE], detail=detail)
        readings = lenient_json(hb_json, {})
        readings = readings if isinstance(readings, dict) else {}
        held = [grant_of(*r) for r in await conn.fetch(SQL_HELD_GRANTS, worker_id)]
        reserved = await conn.fetchrow(SQL_RESERVED_FOR, now, worker_id) \
            if self.reservation_hint.maybe else None  # type: ignore[attr-defined]
        if reserved is not None:
            adm = _Admission(worker_id, readings, held, await _requests(conn, [reserved[0]]))
            short = adm.admit(reserved[0])
            if short is not None:  # the victim's GPU memory is not free yet: nobody else's
                return ClaimResult(reasons=[resources.RESOURCES],
                                   detail=f"reserved for job {reserved[0]}: {short}")
            return await _take(conn, now, worker_id, reserved[0], lease_s, claim_id, bad,
                               adm.grants.get(reserved[0]))
        roles = lenient_json(roles_json, [])
        roles = sorted({r for r in roles if isinstance(r, str)}) if isinstance(roles, list) else []
        walk = await conn.fetch(SQL_WALK, now, decision.allowed, roles, kinds, WALK_MAX) \
            if decision.allowed else []
        adm = _Admission(worker_id, readings, held, {
            r[0]: Request(gpus=r[3], vram_mb=r[4], ram_mb=r[5]) for r in walk if r[3] is not None},
            {r[0]: r[2] for r in walk})
        why: dict[str, str] = {}
        for job_id, prio, *_ in walk:
            short = adm.admit(job_id, prio)
            if short is None:
                return await _take(conn, now, worker_id, job_id, lease_s, claim_id, bad,
                                   adm.grants.get(job_id))
            why.setdefault(resources.RESOURCES, short)
        refused = [p for (p,) in await conn.fetch(sql.SQL_GATED_PRIORITIES, now, roles, kinds,
                                                  decision.allowed)] if decision.refused else []
        reasons = {**why, **{k: v for k, v in decision.reasons(refused).items() if k not in why}}
        if not reasons and await conn.fetchval(sql.SQL_ANY_RUNNABLE, now) is not None:
            reasons[gates.NO_MATCHING_ROLE] = ("no runnable job needs one of this worker's "
                                               "roles" + (" and kinds" if kinds else ""))
        return ClaimResult(reasons=list(reasons), detail="; ".join(reasons.values()))



async def books(conn: Any) -> tuple[dict[str, list[Grant]], dict[str, list[Request]],
                                    dict[str, Grant]]:
    """(worker_id -> grants of its leases, worker_id -> requests its live reservations
    hold, job_id -> its lease's grant)."""
    by_worker: dict[str, list[Grant]] = {}
    by_job: dict[str, Grant] = {}
    reserved: dict[str, list[Request]] = {}
    for worker_id, job_id, *row in await conn.fetch(SQL_ALL_GRANTS):
        by_job[job_id] = g = grant_of(*row)
        by_worker.setdefault(worker_id, []).append(g)
    for worker_id, g, v, r in await conn.fetch(SQL_RESERVED_REQUESTS):
        reserved.setdefault(worker_id, []).append(Request(gpus=g, vram_mb=v, ram_mb=r))
    return by_worker, reserved, by_job


async def requests_of(conn: Any, job_ids: list[str]) -> dict[str, Request]:
    """job_id -> request, for those of `job_ids` that have one."""
    return await _requests(conn, job_ids)


async def job_resources(conn: Any, job_id: str) -> tuple[Request | None, Grant | None]:
    """(the job's request, its lease's grant), each None when absent."""
    req = await conn.fetchrow(SQL_REQUEST_OF, job_id)
    grant = await conn.fetchrow(SQL_GRANT_OF, job_id)
    return (None if req is None else Request(gpus=req[0], vram_mb=req[1], ram_mb=req[2]),
            None if grant is None else grant_of(*grant))


async def _requests(conn: Any, job_ids: list[str]) -> dict[str, Request]:
    return {r[0]: Request(gpus=r[1], vram_mb=r[2], ram_mb=r[3])
            for r in await conn.fetch(SQL_REQUESTS_OF, job_ids)}


async def _take(conn: Any, now: float | None, worker_id: str, job_id: str, lease_s: float,
                claim_id: str | None, bad: list[Any], grant: Grant | None
                ) -> ClaimResult | None:
    """Take the locked job under a new lease with its grant; None if its data does not
    decode (the row appended to `bad`, for claims.dead_letter once this commits)."""
    row = await conn.fetchrow(SQL_TAKE, now, job_id, worker_id, lease_s, claim_id,
                              *grant_row(grant))
    try:
        got = claims.claimed(row)
    except claims.Undecodable:
        bad.append(row)
        return None
    if grant is not None and got.job is not None:
        got.job.gpu_ids = list(grant.gpu_ids) or None
    return got


async def _with_gpus(conn: Any, got: ClaimResult) -> ClaimResult:
    """A replayed claim with its lease's GPUs, as the first reply had them."""
    if got.job is not None:
        row = await conn.fetchrow(SQL_GRANT_OF, got.job.job_id)
        if row is not None:
            got.job.gpu_ids = list(grant_of(*row).gpu_ids) or None
    return got
