"""Schema step and SQL for resource admission (issue 16 item 3, coordd.rules.resources).

A job's request lives in its own small table (`job_resources`, only jobs that ask), so a
claim for a job without one never reads it and a large payload's pages are never walked
for it. What a claim granted lives on the lease row (`gpu_ids`, `vram_mb`, `ram_mb`): it
ends with the lease however the lease ends, so no path can leak a GPU.
Its own schema step: renumber it freely beside other branches' migrations.
"""

from __future__ import annotations

import sqlite3

import msgspec

from coordd.rules.resources import Grant, Request

MIGRATION_RESOURCES = """
    CREATE TABLE job_resources (
        job_id  TEXT PRIMARY KEY REFERENCES jobs(job_id) ON DELETE CASCADE,
        gpus    INTEGER NOT NULL,
        vram_mb INTEGER NOT NULL,
        ram_mb  INTEGER NOT NULL
    ) WITHOUT ROWID;
    ALTER TABLE leases ADD COLUMN gpu_ids TEXT;
    ALTER TABLE leases ADD COLUMN vram_mb INTEGER;
    ALTER TABLE leases ADD COLUMN ram_mb INTEGER
"""

SQL_INSERT_REQUEST = (
    "INSERT OR REPLACE INTO job_resources (job_id, gpus, vram_mb, ram_mb) VALUES (?, ?, ?, ?)"
)
SQL_REQUEST_OF = "SELECT gpus, vram_mb, ram_mb FROM job_resources WHERE job_id = ?"
SQL_REQUESTS_OF = (  # ?1: a JSON list of job ids
    "SELECT job_id, gpus, vram_mb, ram_mb FROM job_resources "
    "WHERE job_id IN (SELECT value FROM json_each(?1))"
)
SQL_ANY_REQUEST = "SELECT 1 FROM job_resources LIMIT 1"
SQL_KIND_OF = "SELECT kind FROM jobs WHERE job_id = ?"
SQL_SET_GRANT = "UPDATE leases SET gpu_ids = ?, vram_mb = ?, ram_mb = ? WHERE job_id = ?"
SQL_GRANT_OF = "SELECT gpu_ids, vram_mb, ram_mb FROM leases WHERE job_id = ?"
_GRANTED = "(gpu_ids IS NOT NULL OR ram_mb IS NOT NULL)"
SQL_HELD_GRANTS = f"SELECT gpu_ids, vram_mb, ram_mb FROM leases WHERE worker_id = ? AND {_GRANTED}"
SQL_ALL_GRANTS = f"SELECT worker_id, gpu_ids, vram_mb, ram_mb FROM leases WHERE {_GRANTED}"
SQL_GRANTS_BY_JOB = f"SELECT job_id, gpu_ids, vram_mb, ram_mb FROM leases WHERE {_GRANTED}"
SQL_RESERVED_REQUESTS = (  # what the reservations still promised ask for, by worker
    "SELECT r.worker_id, q.gpus, q.vram_mb, q.ram_mb FROM reservations r "
    "JOIN job_resources q ON q.job_id = r.job_id JOIN jobs j ON j.job_id = r.job_id "
    "WHERE j.status = 'waiting'"
)


def add_request(conn: sqlite3.Connection, job_id: str, req: Request | None) -> None:
    """Store a new job's request (nothing for None)."""
    if req is not None:
        conn.execute(SQL_INSERT_REQUEST, (job_id, req.gpus, req.vram_mb, req.ram_mb))


def request_of(conn: sqlite3.Connection, job_id: str) -> Request | None:
    """The job's own request, or None."""
    row = conn.execute(SQL_REQUEST_OF, (job_id,)).fetchone()
    return None if row is None else Request(gpus=row[0], vram_mb=row[1], ram_mb=row[2])


def requests_of(conn: sqlite3.Connection, job_ids: list[str]) -> dict[str, Request]:
    """job_id -> request, for those of `job_ids` that have one."""
    text = msgspec.json.encode(job_ids).decode()
    return {job_id: Request(gpus=g, vram_mb=v, ram_mb=r)
            for job_id, g, v, r in conn.execute(SQL_REQUESTS_OF, (text,))}


def any_request(conn: sqlite3.Connection) -> bool:
    """Whether any job ever stored a request (until it is pruned)."""
    return conn.execute(SQL_ANY_REQUEST).fetchone() is not None


def kind_of(conn: sqlite3.Connection, job_id: str) -> str | None:
    """The job's kind (for a worker's kind default), or None."""
    row = conn.execute(SQL_KIND_OF, (job_id,)).fetchone()
    return None if row is None else row[0]


def _grant(gpu_ids: str | None, vram_mb: int | None, ram_mb: int | None) -> Grant:
    ids = tuple(int(i) for i in msgspec.json.decode(gpu_ids)) if gpu_ids else ()
    return Grant(gpu_ids=ids, vram_mb=vram_mb or 0, ram_mb=ram_mb or 0)


def set_grant(conn: sqlite3.Connection, job_id: str, grant: Grant) -> None:
    """Record on the job's new lease what it was granted."""
    conn.execute(SQL_SET_GRANT, (msgspec.json.encode(list(grant.gpu_ids)).decode() if grant.gpu_ids else None,
                                 grant.vram_mb, grant.ram_mb, job_id))


def grant_of(conn: sqlite3.Connection, job_id: str) -> Grant | None:
    """What the job's lease was granted, or None (no lease, or nothing granted)."""
    row = conn.execute(SQL_GRANT_OF, (job_id,)).fetchone()
    return None if row is None or (row[0] is None and row[2] is None) else _grant(*row)


def held_by_worker(conn: sqlite3.Connection, worker_id: str) -> list[Grant]:
    """The grants of the leases `worker_id` holds."""
    return [_grant(*row) for row in conn.execute(SQL_HELD_GRANTS, (worker_id,))]


def all_grants(conn: sqlite3.Connection) -> dict[str, list[Grant]]:
    """worker_id -> the grants of its leases (for `workers` and `show`)."""
    out: dict[str, list[Grant]] = {}
    for worker_id, *row in conn.execute(SQL_ALL_GRANTS):
        out.setdefault(worker_id, []).append(_grant(*row))
    return out


def grants_by_job(conn: sqlite3.Connection) -> dict[str, Grant]:
    """job_id -> what its lease holds, for every lease that holds something."""
    return {job_id: _grant(*row) for job_id, *row in conn.execute(SQL_GRANTS_BY_JOB)}


def reserved_requests(conn: sqlite3.Connection) -> dict[str, list[Request]]:
    """worker_id -> the requests of the jobs its live reservations wait for."""
    out: dict[str, list[Request]] = {}
    for worker_id, gpus, vram, ram in conn.execute(SQL_RESERVED_REQUESTS):
        out.setdefault(worker_id, []).append(Request(gpus=gpus, vram_mb=vram, ram_mb=ram))
    return out
