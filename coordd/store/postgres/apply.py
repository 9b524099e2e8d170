"""PostgresStore's side of coordd.rules.transitions: the decisions written with its statements.

The job state machine is coordd.rules.transitions (pure), shared with the SQLite store; this
module maps each decision to the statement that writes it (as coordd.store.apply does for
SQLite), and gives the two one-statement paths (the batched complete, the reaper) the
texts of the decisions they stand for, so their CASE branches write what the state
machine says. The caller's transaction holds the job row (sql.SQL_END_LEASE,
sql.SQL_LOCK_STATUS).
"""

from __future__ import annotations

from typing import Any

from coordd.rules import transitions as tr
from coordd.store.postgres import sql

_WORKER = "\x00worker\x00"  # stands for the lost worker's id in a decision's text


def held(row: Any) -> tr.Held:
    """A Held from the first 12 columns of sql.SQL_FENCE_STATE / SQL_END_LEASE."""
    return tr.Held(*tuple(row)[:12])


async def apply(conn: Any, now: float | None, job_id: str, worker_id: str | None,
                d: tr.Decision, checkpoint_json: str | None = None) -> None:
    """Write `d` for the job and log its event. A holder's lease was already ended by the
    fenced statement that read it (`d.drop_lease`); `checkpoint_json`: a release's, stored
    with the job's new state.

    Raises:
        ValueError: `d.t` is written by another statement here (the claim's take, the
            enqueue, the batched complete, the reaper) or by no statement of this store.
    """
    t = d.t
    to, cause = t.to_status, t.cause
    if t is tr.RELEASED:
        await conn.execute(sql.SQL_RELEASE_JOB, now, job_id, d.last_error, checkpoint_json)
    elif cause == tr.RETRY and to == tr.WAITING:
        await conn.execute(sql.SQL_RETRY, now, job_id)
    elif t is tr.FAIL_RETRY:
        await conn.execute(sql.SQL_TO_WAITING, now, job_id, d.last_error, d.run_at)
    elif t is tr.CANCEL_REQUEST:
        await conn.execute(sql.SQL_REQUEST_CANCEL, now, job_id)
    elif t in (tr.FAIL_FAILED, tr.CANCEL_HONOURED) or t in tr.CANCEL_NOW.values():
        if checkpoint_json is not None:
            await conn.execute(sql.SQL_SET_CHECKPOINT, now, job_id, checkpoint_json)
        await conn.execute(sql.SQL_TO_TERMINAL, now, job_id, to, d.last_error)
    else:
        raise ValueError(f"PostgresStore does not write {t} here")
    await conn.execute(sql.SQL_EVENT, now, job_id, worker_id, t.from_status, to, d.reason)


def _held(cancel: bool, attempts: int = 1, max_attempts: int = 3) -> tr.Held:
    return tr.Held(tr.RUNNING, cancel, None, attempts, max_attempts, 1, "w", 1, 0.0, 1.0)


_COMPLETE_CANCELLED = tr.complete(_held(True), 0.0, None, False)
COMPLETE_TEXTS = (_COMPLETE_CANCELLED.last_error, _COMPLETE_CANCELLED.reason)
"""(last_error, event reason) of a complete that meets a requested cancel."""


def _lost_texts(code: str) -> tuple[str, ...]:
    cancelled = tr.lost_lease(_WORKER, 1, 3, True, code, 0.0)
    exhausted = tr.lost_lease(_WORKER, 3, 3, False, code, 0.0)
    requeued = tr.lost_lease(_WORKER, 1, 3, False, code, 0.0)
    before, _, after = (requeued.last_error or "").partition(_WORKER)
    return (cancelled.last_error, cancelled.reason, exhausted.last_error, exhausted.reason,
            before, after, requeued.reason)


REAP_TEXTS = _lost_texts(tr.LEASE_EXPIRED)
"""The reaper's texts from tr.lost_lease: (cancelled last_error, reason; exhausted
last_error, reason; requeued last_error before and after the worker id, reason)."""
