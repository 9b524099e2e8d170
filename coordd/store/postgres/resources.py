"""PostgresStore's resource admission (coordd.rules.resources decides,
coordd.store.claim_admission walks): a job's request (`job_resources`), what a lease was granted
(on the lease row), and the claim's resource step. Every statement of it is here.

While no job ever asked for resources (`resources_seen`: an enqueue with a request, or a request
found in the database at start) and the worker names no kind defaults, claims take the batched
SKIP LOCKED path of coordd.store.postgres.claims and nothing here runs. Otherwise the claim is
the admission walk (coordd.store.postgres.admission), which judges each candidate's gates, then
its resources (`ClaimResources`: coordd.store.claim_admission.Admission, the SQLite claim's
rules), then its limits, and writes the grant on the new lease in the statement that takes the
job. The rule not to break: a claim reads the worker's held grants only under the worker's claim
lock (SQL_WORKER_LOCK), so two claims of one worker at once never grant the same GPU.
"""

from __future__ import annotations

from typing import Any

import msgspec

from coordd.store import claim_admission as admission
from coordd.wire.protocol import ClaimResult
from coordd.rules.resources import Grant, Request

# one worker's claims, one at a time, while they admit resources (to its transaction's end)
SQL_WORKER_LOCK = "SELECT pg_advisory_xact_lock(hashtext('coordd-claim-worker'), hashtext($1))"

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
SQL_GRANT_OF = "SELECT gpu_ids, vram_mb, ram_mb FROM leases WHERE job_id = $1 AND " + _GRANTED
SQL_REQUEST_OF = "SELECT gpus, vram_mb, ram_mb FROM job_resources WHERE job_id = $1"


def active(seen: bool, heartbeat_json: str) -> bool:
    """Whether a claim admits resources: a job ever asked (`seen`), or the worker's
    heartbeat names kind defaults (coordd.store.claim_admission.needed, SQLite's rule)."""
    return admission.needed(seen, heartbeat_json)


class ClaimResources(admission.Admission):
    """coordd.store.claim_admission.Admission for one claim on this store: the worker's held grants
    read once under its claim lock (`open`), the candidates' requests and kinds learnt
    page by page (`learn`) before they are admitted."""

    def __init__(self, conn: Any, worker_id: str, readings: dict[str, Any]) -> None:
        super().__init__(None, worker_id, readings)  # type: ignore[arg-type]
        self._pg = conn
        self._requests: dict[str, Request] = {}
        self._kinds: dict[str, str] = {}

    @classmethod
    async def open(cls, conn: Any, worker_id: str,
                   readings: dict[str, Any]) -> ClaimResources:
        """Take the worker's claim lock and read its held grants (in the claim's
        transaction)."""
        await conn.execute(SQL_WORKER_LOCK, worker_id)
        got = cls(conn, worker_id, readings)
        got._held = [grant_of(*r) for r in await conn.fetch(SQL_HELD_GRANTS, worker_id)]
        return got

    async def learn(self, jobs: list[tuple[str, str]]) -> None:
        """Read the requests of the candidates (job_id, kind) not seen yet."""
        new = [j for j, _ in jobs if j not in self._kinds]
        self._kinds.update(jobs)
        if new:
            self._requests.update(await _requests(self._pg, new))

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


async def with_gpus(conn: Any, got: ClaimResult) -> ClaimResult:
    """A replayed claim (a repeated claim_id) with its lease's GPUs, as the first reply
    had them."""
    if got.job is not None:
        row = await conn.fetchrow(SQL_GRANT_OF, got.job.job_id)
        if row is not None:
            got.job.gpu_ids = list(grant_of(*row).gpu_ids) or None
    return got
