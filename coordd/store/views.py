"""The read side: stored rows -> the view Structs of `get_job`, `list_jobs`, `workers`.

Runs on the read-only connection. Stored JSON that does not decode is shown as
`{"undecodable": ...}` (or an empty default), never raised: a damaged row must not
hide the others; nor does a time column holding text (`_num`: shown as NaN).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from coordd import errors
from coordd.rules.claim_policy import effective_priority
from coordd.wire.protocol import JOB_STATUSES, ArtifactRef, EventView, JobView, LeaseView
from coordd.jsontext import lenient_json
from coordd.store.schema import PRAGMA_FOREIGN_KEY_CHECK, PRAGMA_QUICK_CHECK
from coordd.store.counters import SQL_COUNTS, SQL_FULL_COUNTS
from coordd.store.latency import SQL_OLDEST_READY
from coordd.store.reads import (
    JOB_BLOBS, SQL_ARTIFACT_REFS, SQL_CHECKPOINT_REFS, SQL_COUNT_JOBS, SQL_COUNT_LEASES,
    SQL_COUNT_WORKERS, SQL_EVENTS, SQL_GET_JOB, SQL_JOB_BLOB_TYPES, SQL_JOB_EXISTS, SQL_JOB_IDS_FROM,
    SQL_LIST_BLOB_TYPES, SQL_LIST_BLOB_TYPES_NEWEST, SQL_LIST_JOBS, SQL_LIST_JOBS_NEWEST,
    SQL_PRUNABLE_CAPPED, SQL_WORKERS,
)


def _job_view(row: sqlite3.Row | tuple, now: float, aging_s: float,
              events: list[EventView] | None = None) -> JobView:
    (job_id, kind, role, prio, status, attempts, max_attempts, run_at, queued_at, created_at,
     updated_at, finished_at, payload_json, result_json, last_error, checkpoint_json, cancel,
     key, max_runtime_s, gates_json, a_sha, a_size, a_path, l_worker, l_token, l_granted,
     l_expires, l_lease_s) = row
    run_at, queued_at, created_at, updated_at = map(
        _num, (run_at, queued_at, created_at, updated_at))
    finished_at, max_runtime_s = _num_or_none(finished_at), _num_or_none(max_runtime_s)
    if l_worker:
        l_granted, l_expires, l_lease_s = map(_num, (l_granted, l_expires, l_lease_s))
    return JobView(
        job_id=job_id, kind=kind, required_role=role, priority=prio,
        effective_priority=(effective_priority(prio, queued_at, now, aging_s)
                            if status == "waiting" else prio),
        status=status, attempts=attempts, max_attempts=max_attempts, run_at=run_at,
        created_at=created_at, updated_at=updated_at, age_s=max(0.0, now - created_at),
        payload=lenient_json(payload_json), result=lenient_json(result_json),
        artifact=ArtifactRef(sha256=a_sha, size=a_size, path=a_path) if a_sha else None,
        last_error=last_error, checkpoint=lenient_json(checkpoint_json),
        cancel_requested=bool(cancel), idempotency_key=key, max_runtime_s=max_runtime_s,
        finished_at=finished_at,
        lease=(LeaseView(worker_id=l_worker, token=l_token, granted_at=l_granted,
                         expires_at=l_expires, lease_s=l_lease_s) if l_worker else None),
        events=events or [],
        gates=lenient_json(gates_json),
    )


def _num(value: Any) -> float:
    """A stored number as it is; anything else (text or a blob in a REAL column, from a
    hand edit) as NaN, which every view prints as not a valid time."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return float("nan")


def _num_or_none(value: Any) -> float | None:
    return None if value is None else _num(value)


def get_job(conn: sqlite3.Connection, now: float, job_id: str, aging_s: float) -> JobView:
    """Return one job with its lease and event log.

    Raises:
        errors.NotFound: no such job.
    """
    row = conn.execute(SQL_GET_JOB, (job_id,)).fetchone()
    if row is None:
        raise errors.NotFound(f"job {job_id} not found")
    events = [EventView(at=_num(r[0]), from_status=r[1], to_status=r[2], worker_id=r[3],
                        reason=r[4])
              for r in conn.execute(SQL_EVENTS, (job_id,))]
    return _job_view(row, now, aging_s, events)


def job_bytes(conn: sqlite3.Connection, job_id: str) -> int:
    """The bytes of stored JSON (payload, result, checkpoint, ...) the job's view carries:
    its reply's size, less a small envelope, known before the row is read (0: no such job)."""
    row = conn.execute(SQL_JOB_BLOB_TYPES, (job_id,)).fetchone()
    return 0 if row is None else _stored_bytes(conn, row)


LISTED_JOB_BYTES = 420  # a listed job's view without its JSON values, msgpack-encoded


def page_bytes(conn: sqlite3.Connection, *, status: str | None, kind: str | None,
               role: str | None, priority: int | None, limit: int, after: str | None,
               newest_first: bool = False) -> int:
    """The bytes the `list_jobs` page of these filters will carry (the JSON values as
    `job_bytes`, plus LISTED_JOB_BYTES a job), known before any of its rows is read.
    An `after` that names no job sizes as an empty page (`list_jobs` refuses it)."""
    sql = SQL_LIST_BLOB_TYPES_NEWEST if newest_first else SQL_LIST_BLOB_TYPES
    total = 0
    for row in conn.execute(sql, (status, kind, role, priority, after, limit)).fetchall():
        total += LISTED_JOB_BYTES + _stored_bytes(conn, row)
    return total


def _stored_bytes(conn: sqlite3.Connection, row: tuple) -> int:
    """The bytes of the JSON columns flagged in `row` (rowid, then one flag per JOB_BLOBS
    column), from the record header: the values themselves are not read."""
    total = 0
    for column, stored in zip(JOB_BLOBS, row[1:]):
        if stored:
            with conn.blobopen("jobs", column, row[0], readonly=True) as blob:
                total += len(blob)
    return total


PREFIX_MATCHES_SHOWN = 5


def resolve_job_id(conn: sqlite3.Connection, given: str) -> str:
    """The job id `given` is, or the one job id it is the start of.

    Raises:
        errors.NotFound: no job id is or starts with it.
        errors.BadRequest: it is empty, or several job ids start with it (a few are named).
    """
    return resolve_prefix(conn, given, "job", SQL_JOB_EXISTS, SQL_JOB_IDS_FROM)


def resolve_prefix(conn: sqlite3.Connection, given: str, what: str, exists_sql: str,
                   range_sql: str) -> str:
    """The id `given` is, or the one id it is the start of, for a table whose statements
    `exists_sql` (the id -> a row) and `range_sql` (ids in [?1, ?2), at most ?3) are given.

    Raises:
        errors.NotFound: no id is or starts with it.
        errors.BadRequest: it is empty, or several ids start with it (a few are named).
    """
    if not given:
        raise errors.BadRequest(f"{what}_id must not be empty")
    return pick_prefix(what, given, prefix_matches(conn, given, exists_sql, range_sql,
                                                   PREFIX_MATCHES_SHOWN + 1))


def prefix_matches(conn: sqlite3.Connection, given: str, exists_sql: str, range_sql: str,
                   most: int) -> list[str]:
    """[given] when it is an id, else up to `most` ids that start with it, in id order."""
    if conn.execute(exists_sql, (given,)).fetchone() is not None:
        return [given]
    return [r[0] for r in conn.execute(range_sql, (given, given + "\U0010ffff", most))
            if r[0].startswith(given)]


def pick_prefix(what: str, given: str, ids: list[str]) -> str:
    """The one id of `ids` (a store's prefix matches of `given`, up to
    PREFIX_MATCHES_SHOWN + 1 of them).

    Raises:
        errors.NotFound: no id is or starts with it.
        errors.BadRequest: it is empty, or several ids start with it (a few are named).
    """
    if not given:
        raise errors.BadRequest(f"{what}_id must not be empty")
    if not ids:
        raise errors.NotFound(f"{what} {given} not found (no {what} id starts with it)")
    if len(ids) > 1:
        shown = ", ".join(ids[:PREFIX_MATCHES_SHOWN])
        more = " and more" if len(ids) > PREFIX_MATCHES_SHOWN else ""
        raise errors.BadRequest(f"{what} id prefix {given!r} is ambiguous: it starts {shown}"
                                f"{more}; give more characters")
    return ids[0]


def list_jobs(conn: sqlite3.Connection, now: float, *, status: str | None, kind: str | None,
              role: str | None, priority: int | None, limit: int, after: str | None,
              aging_s: float, newest_first: bool = False) -> list[JobView]:
    """Return up to `limit` jobs matching every given filter, in enqueue order after the
    job `after` (newest first, and before it, with `newest_first`).

    Raises:
        errors.NotFound: `after` names no job (a page cannot be continued from it).
    """
    if after is not None and conn.execute(SQL_JOB_EXISTS, (after,)).fetchone() is None:
        raise errors.NotFound(f"job {after} not found (the page's `after`)")
    sql = SQL_LIST_JOBS_NEWEST if newest_first else SQL_LIST_JOBS
    rows = conn.execute(sql, (status, kind, role, priority, after, limit)).fetchall()
    return [_job_view(r, now, aging_s) for r in rows]


def list_workers(conn: sqlite3.Connection
                 ) -> list[tuple[str, list[str], dict[str, Any], float, int]]:
    """Return (worker_id, roles, readings, heartbeat_at, active_leases) for every worker."""
    out = []
    for worker_id, roles_json, hb_json, hb_at, n in conn.execute(SQL_WORKERS):
        out.append((worker_id, lenient_json(roles_json, []), lenient_json(hb_json, {}),
                    _num(hb_at), n))
    return out


def integrity(conn: sqlite3.Connection) -> tuple[str, list[list[Any]]]:
    """Run `PRAGMA quick_check` and `foreign_key_check`: ("ok" or the problems joined by
    "; ", the foreign-key violation rows). Used on the live DB, backups and copies."""
    qc = "; ".join(str(r[0]) for r in conn.execute(PRAGMA_QUICK_CHECK))
    return qc, [list(r) for r in conn.execute(PRAGMA_FOREIGN_KEY_CHECK)]


def artifact_refs(conn: sqlite3.Connection) -> dict[str, str]:
    """sha256 -> path of every artifact and checkpoint file the database refers to (a
    checkpoint record's `previous` entries too)."""
    refs = {sha: path for sha, path in conn.execute(SQL_ARTIFACT_REFS)}
    for _job, _key, sha, path in conn.execute(SQL_CHECKPOINT_REFS):
        if isinstance(path, str):
            refs.setdefault(sha, path)
    return refs


def count_jobs(conn: sqlite3.Connection) -> int:
    """Count every job (a backup copy's check)."""
    return conn.execute(SQL_COUNT_JOBS).fetchone()[0]


PRUNABLE_COUNTED_MAX = 1000  # `status` counts prunable jobs up to this (bounded cost)


def prunable(conn: sqlite3.Connection, cutoff: float, most: int = PRUNABLE_COUNTED_MAX) -> int:
    """Count terminal jobs finished before `cutoff` (what `prune` would delete), up to
    `most`: the count costs at most `most` index rows."""
    return conn.execute(SQL_PRUNABLE_CAPPED, (cutoff, most)).fetchone()[0]


def _by_status(rows: Any) -> tuple[dict[str, int], dict[str, int]]:
    jobs = dict.fromkeys(JOB_STATUSES, 0)
    waiting = {f"p{p}": 0 for p in range(4)}
    for status, prio, n in rows:
        jobs[status] = jobs.get(status, 0) + n
        if status == "waiting":
            waiting[f"p{prio}"] += n
    return jobs, waiting


def full_counts(conn: sqlite3.Connection) -> tuple[dict[str, int], dict[str, int]]:
    """(jobs by status, waiting by priority) by counting every job: what the counters
    must always equal (tests, `check`)."""
    return _by_status(conn.execute(SQL_FULL_COUNTS))


def status_counts(conn: sqlite3.Connection, now: float, stale_s: float
                  ) -> tuple[int, int, int, dict[str, int], dict[str, int], float | None]:
    """Return (workers, workers_live, active_leases, jobs by status (every status present),
    waiting by priority "p0".."p3", queue latency in seconds or None: how long the
    oldest due waiting job has waited since it became runnable, coordd.store.latency).

    The job counts come from the counters the writer's triggers keep
    (coordd.store.counters), not from counting jobs: the cost does not grow with them.
    """
    jobs, waiting = _by_status(conn.execute(SQL_COUNTS))
    oldest = _num_or_none(conn.execute(SQL_OLDEST_READY, (now,)).fetchone()[0])
    workers, live = conn.execute(SQL_COUNT_WORKERS, (now - stale_s,)).fetchone()
    leases = conn.execute(SQL_COUNT_LEASES).fetchone()[0]
    return workers, live, leases, jobs, waiting, (None if oldest is None else now - oldest)


def counts_view(counts: dict[tuple[str, int], int]
                ) -> tuple[dict[str, int], dict[str, int]]:
    """(jobs by status, waiting by priority) from counters by (status, priority)."""
    return _by_status((s, p, n) for (s, p), n in counts.items())


def status_live(conn: sqlite3.Connection, now: float, stale_s: float, cutoff: float
                ) -> tuple[int, int, int, float | None, int]:
    """What `status` reads beside the job counters, in one read: (workers, workers_live,
    active_leases, queue latency in seconds or None (coordd.store.latency), prunable jobs
    finished before `cutoff`, counted up to PRUNABLE_COUNTED_MAX)."""
    oldest = _num_or_none(conn.execute(SQL_OLDEST_READY, (now,)).fetchone()[0])
    workers, live = conn.execute(SQL_COUNT_WORKERS, (now - stale_s,)).fetchone()
    leases = conn.execute(SQL_COUNT_LEASES).fetchone()[0]
    return (workers, live, leases, None if oldest is None else now - oldest,
            prunable(conn, cutoff))
