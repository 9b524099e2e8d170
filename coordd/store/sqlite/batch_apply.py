"""How one batch of the single writer runs inside its BEGIN IMMEDIATE and COMMITs
(coordd.store.sqlite.writer.Writer takes this mixin): `now` read once, a wall-clock step
taken first (coordd.store.sqlite.clock_steps), the batch's changes to jobs journalled
(coordd.store.sqlite.job_changes), the figures of WriterStats kept.

How an op rolls back alone: the batch runs under one SAVEPOINT (a batch of one op runs
without: its transaction holds nothing else, so an op that fails after writing rolls it
all back, and a recount or clock step it began with is taken again by the next batch).
An op that raises having changed no row (`Connection.total_changes` unchanged: the usual
refusal, a fence check or a constraint hit by its first write, which SQLite undoes
itself) needs nothing undone. An op that raises after changing rows sends the batch back
to that savepoint, and the batch runs again with a SAVEPOINT per op. Ops are functions of
(connection, now) only, so running them again gives the same results. An op error that
made SQLite cancel the whole transaction (SQLITE_FULL, IOERR, NOMEM, INTERRUPT can) ends
the batch at once.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sqlite3
from collections.abc import Callable
from typing import Any

from coordd import errors
from coordd.clock import Clock
from coordd.store.sqlite.clock_steps import ClockSteps
from coordd.store.sqlite.job_changes import JobChanges
from coordd.store.sqlite.storage_health import StorageHealth, storage_reason

logger = logging.getLogger(__name__)

WriteOp = Callable[[sqlite3.Connection, float], Any]


class WriterStats:
    """Counters the writer keeps: batches, requests, commit seconds (for metrics and bench)."""

    def __init__(self) -> None:
        self.batches = 0
        self.requests = 0
        self.commit_s_total = 0.0
        self.max_batch = 0
        self.reruns = 0  # batches run again with a savepoint per op (an op failed mid-write)
        self.wal_cuts = 0  # TRUNCATE checkpoints of a WAL past its bound (sqlite.checkpointer)
        self.commit_times: collections.deque[float] = collections.deque(maxlen=4096)


class BatchApply:
    """Run a batch of write ops in the open transaction and COMMIT (a mixin: the Writer
    has the clock, the clock-step rule, the change journal, the storage health, the
    stats and the `on_clock_step` hook)."""

    _clock: Clock
    _steps: ClockSteps
    changes: JobChanges
    health: StorageHealth
    stats: WriterStats
    on_clock_step: Callable[[float], None] | None

    def _apply(self, conn: sqlite3.Connection,
               batch: list[tuple[WriteOp, asyncio.Future[Any], float]]) -> list[tuple[Any, Any]]:
        """Run one batch inside the open BEGIN IMMEDIATE (see the module docstring), COMMIT."""
        t0 = self._clock.mono()
        now = self._clock.wall()
        try:
            self.changes.begin(conn)
            step = self._steps.check(conn, now)
            now += step
            if len(batch) == 1:
                outcomes = self._run_alone(conn, batch[0][0], now)
            else:
                outcomes = self._run_ops(conn, batch, now)
                if outcomes is None:
                    self.stats.reruns += 1
                    outcomes = self._run_ops_one_savepoint_each(conn, batch, now)
            if conn.in_transaction:  # not when a lone op failing after writes rolled it back
                self.changes.flush(conn)
                conn.execute("COMMIT")
        except BaseException:
            self.changes.discard()
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if outcomes[0][0] is not None:  # committed
            self.changes.committed()
            if step:  # after the COMMIT: a step seen in a rolled-back batch is seen again
                self._clock.shift(step)
                if self.on_clock_step is not None:
                    self.on_clock_step(step)
            self._steps.last_seen = now
        else:
            outcomes = [(False, outcomes[0][1])]
        dt = self._clock.mono() - t0
        st = self.stats
        st.batches += 1
        st.requests += len(batch)
        st.commit_s_total += dt
        st.max_batch = max(st.max_batch, len(batch))
        st.commit_times.append(dt)
        return outcomes

    def _run_alone(self, conn: sqlite3.Connection, op: WriteOp,
                   now: float) -> list[tuple[bool | None, Any]]:
        """A batch of one op, without a SAVEPOINT: an op that raises after changing rows
        has the whole transaction rolled back here ([(None, error)]: nothing to commit;
        a recount or clock step the batch began with is taken again by the next one)."""
        changes, mark = conn.total_changes, len(self.changes.journal)
        try:
            return [(True, op(conn, now))]
        except Exception as exc:
            _check_still_in_transaction(conn, exc)
            if conn.total_changes == changes:
                self.changes.undo(mark)  # a statement that failed midway undid its rows
                return [(False, self._op_error(exc))]
            err = self._op_error(exc)
            conn.execute("ROLLBACK")
            self.changes.discard()
            return [(None, err)]

    def _run_ops(self, conn: sqlite3.Connection,
                 batch: list[tuple[WriteOp, asyncio.Future[Any], float]],
                 now: float) -> list[tuple[bool, Any]] | None:
        """All ops under one savepoint; None (and nothing of the batch kept) when an op
        raised after changing rows."""
        conn.execute("SAVEPOINT batch")
        outcomes: list[tuple[bool, Any]] = []
        journal = self.changes.journal
        for op, _, _ in batch:
            changes, mark = conn.total_changes, len(journal)
            try:
                outcomes.append((True, op(conn, now)))
            except Exception as exc:
                _check_still_in_transaction(conn, exc)
                if conn.total_changes != changes:
                    conn.execute("ROLLBACK TO batch")
                    conn.execute("RELEASE batch")
                    self.changes.undo(0)
                    return None
                self.changes.undo(mark)  # a statement that failed midway undid its rows
                outcomes.append((False, self._op_error(exc)))
        conn.execute("RELEASE batch")
        return outcomes

    def _run_ops_one_savepoint_each(self, conn: sqlite3.Connection,
                                    batch: list[tuple[WriteOp, asyncio.Future[Any], float]],
                                    now: float) -> list[tuple[bool, Any]]:
        outcomes: list[tuple[bool, Any]] = []
        journal = self.changes.journal
        for op, _, _ in batch:
            conn.execute("SAVEPOINT op")
            mark = len(journal)
            try:
                outcomes.append((True, op(conn, now)))
                conn.execute("RELEASE op")
            except Exception as exc:
                _check_still_in_transaction(conn, exc)
                conn.execute("ROLLBACK TO op")
                conn.execute("RELEASE op")
                self.changes.undo(mark)
                outcomes.append((False, self._op_error(exc)))
        return outcomes

    def _op_error(self, exc: Exception) -> errors.CoordError:
        """The error an op's caller gets: its CoordError, `unavailable` for a storage
        refusal (disk full inside the statement), or `internal` (logged) for a bug."""
        if isinstance(exc, errors.CoordError):
            return exc
        reason = storage_reason(exc)
        if reason is not None:
            return self.health.refuse(exc, reason, 1, self._clock.wall(), self._clock.mono())
        logger.error("write op failed", exc_info=exc, extra={"action": "op_failed"})
        return errors.CoordError(f"internal error: {type(exc).__name__}: {exc}")


def settle_futures(batch: list[tuple[WriteOp, asyncio.Future[Any], float]],
                   outcomes: list[tuple[bool, Any]]) -> None:
    """Resolve each request's future with its outcome (ok, result or error)."""
    for (_, fut, _t), (ok, value) in zip(batch, outcomes):
        if fut.done():
            continue  # the caller went away; the op is committed all the same
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def batch_error(exc: Exception) -> errors.CoordError:
    """The error every request of a failed batch gets: nothing of the batch is stored.

    A busy or locked file (an outside process held the write lock past the busy
    timeout) is `overloaded`, which callers retry; no reply says "database is locked".
    """
    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
        return errors.Overloaded("the database file is busy (held by another process past "
                                 "the busy timeout); nothing was stored, retry")
    return errors.CoordError(f"commit failed, nothing stored: {exc}")


def _check_still_in_transaction(conn: sqlite3.Connection, exc: Exception) -> None:
    """Raise if the op's error made SQLite roll back the whole transaction.

    SQLITE_FULL, SQLITE_IOERR, SQLITE_NOMEM or SQLITE_INTERRUPT on a write may cancel the
    entire transaction, not only the statement (https://sqlite.org/lang_transaction.html),
    and without touching `total_changes`. The ops after it would then run in autocommit
    mode, each of its writes committed at once, while the batch ends with "nothing stored"
    for every request: the batch must end here (nothing of it is stored: true).
    """
    if not conn.in_transaction:
        raise errors.CoordError(
            f"the transaction was rolled back by SQLite ({type(exc).__name__}: {exc})"
        ) from exc
