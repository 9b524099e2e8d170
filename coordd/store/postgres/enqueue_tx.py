"""Transactional enqueue: put a job in the caller's own PostgreSQL transaction.

An application on the same database enqueues with its own rows, atomically: the job
exists if and only if the caller's transaction commits, and coordd's claimers are woken
at that commit (NOTIFY is delivered then). Needs the schema PostgresStore migrates.

    async with conn.transaction():
        await conn.execute("INSERT INTO orders ...")
        job_id = await enqueue_tx.enqueue(conn, kind="embed", required_role="cpu",
                                          payload={"order": 42}, priority=1)
"""

from __future__ import annotations

from typing import Any

from coordd import errors
from coordd.rules import values
from coordd.clock import Clock, SystemClock
from coordd.rules.idempotency import request_hash
from coordd.ids import JobIds
from coordd.rules.names import check_name
from coordd.wire.protocol import PRIORITIES, Enqueue
from coordd.store.postgres import sql
from coordd.rules.times import check_duration, check_time

MAX_PAYLOAD_BYTES_DEFAULT = 1 << 20  # coordd's max_payload_bytes default
MAX_ATTEMPTS_DEFAULT = 3

_ids = JobIds()


async def enqueue(conn: Any, *, kind: str, required_role: str, payload: Any = None,
                  priority: int = 2, run_at: float | None = None,
                  max_attempts: int = MAX_ATTEMPTS_DEFAULT,
                  max_runtime_s: float | None = None, idempotency_key: str | None = None,
                  max_payload_bytes: int = MAX_PAYLOAD_BYTES_DEFAULT,
                  clock: Clock | None = None) -> tuple[str, bool]:
    """Insert a waiting job on `conn` inside its open transaction; return (job_id, created).

    Times are stamped by the database (`now()` of the caller's transaction); `run_at`
    None means runnable at once. A repeated `idempotency_key` of the same request returns
    the existing job with created=False.

    Args:
        conn: the caller's asyncpg connection, in a transaction.
        clock: where the job id's time part comes from (tests pin it).

    Raises:
        errors.BadRequest: `conn` is not in a transaction, or a name, priority, attempt
            count or time is invalid.
        errors.PayloadTooLarge: the payload's JSON is over `max_payload_bytes`.
        errors.InvalidState: the key names a job made by another request.
    """
    if not conn.is_in_transaction():
        raise errors.BadRequest("enqueue_tx.enqueue needs the caller's transaction "
                                "(use `async with conn.transaction():`)")
    check_name("kind", kind)
    check_name("required_role", required_role)
    if priority not in PRIORITIES:
        raise errors.BadRequest(f"priority must be 0..3, got {priority}")
    if max_attempts < 1:
        raise errors.BadRequest(f"max_attempts must be >= 1, got {max_attempts}")
    check_time("run_at", run_at)
    check_duration("max_runtime_s", max_runtime_s)
    payload_json = values.encode("payload", payload, max_payload_bytes)
    sha = None
    if idempotency_key is not None:
        check_name("idempotency_key", idempotency_key)
        sha = request_hash(Enqueue(kind=kind, required_role=required_role, priority=priority,
                                   payload=payload, run_at=run_at, max_attempts=max_attempts,
                                   max_runtime_s=max_runtime_s), max_attempts, None)
    job_id = _ids.new((clock or SystemClock()).wall())
    created = await conn.fetch(sql.SQL_ENQUEUE, None, [job_id], [kind], [required_role],
                               [priority], [payload_json], [max_attempts], [run_at], [None],
                               [idempotency_key], [max_runtime_s], [None], [None], [sha])
    if created:  # its NOTIFY comes from a trigger (push_sql.MIGRATION_CLAIM_WAKE)
        return job_id, True
    row = await conn.fetchrow(sql.SQL_BY_KEYS, [idempotency_key])  # (key, job_id, hash)
    if row is None:
        raise errors.InvalidState(f"job {job_id}: not stored (id taken)")
    if row[2] is not None and row[2] != sha:
        raise errors.InvalidState(f"idempotency key {idempotency_key!r} is taken by job "
                                  f"{row[1]}, made by another request")
    return row[1], False
