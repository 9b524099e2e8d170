"""The single writer: one task owns the write connection and group-commits requests.

Callers `submit(op)` an operation `op(conn, now) -> result` and await its future. The
writer drains what is queued (up to `batch_max`, the urgent lane first: coordd.store.sqlite.lanes),
opens `BEGIN IMMEDIATE`, runs the ops (an op that raises rolls back alone and fails only
its own future), `COMMIT`s once, and only then resolves the futures: no reply reports a
state that is not yet durable (docs/internals/design.md). How one batch runs inside its
transaction (`now` read once, wall-clock steps, a savepoint per op where one fails):
coordd.store.sqlite.batch_apply.

The batch runs on the event loop's own thread with a plain `sqlite3` connection; a write lock
held by another process is waited for with asyncio sleeps, and WAL checkpoints run on
coordd.store.sqlite.checkpointer's thread. A batch lingers up to `linger_rounds` loop iterations
while requests keep arriving and fewer are queued than `peers()` (group commit); a lone
peer's request to an idle writer runs at once, in the caller's step (`submit`). What each
batch changes in jobs is seen by coordd.store.sqlite.job_changes (counters, kinds, wake-ups).
Why each of these, with the measurements: docs/decisions.md, "writer" and "onec".
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from typing import Any

from coordd import errors, store
from coordd.store.sqlite import lanes
from coordd.store.sqlite.batch_apply import (BatchApply, WriteOp, WriterStats, batch_error,
                                              settle_futures)
from coordd.store.sqlite.checkpointer import WalCheckpointer
from coordd.clock import Clock, anchored
from coordd.store.sqlite.clock_steps import ClockSteps
from coordd.store.sqlite.job_changes import JobChanges
from coordd.ops.metrics import Metrics
from coordd.store.sqlite.storage_health import StorageHealth, storage_reason

logger = logging.getLogger(__name__)

LINGER_ROUNDS = 4  # loop iterations a batch may wait for more requests (see above)


class Writer(BatchApply):
    """Own the write connection to `path`; serialize and group-commit every mutation.

    Args:
        path: the SQLite file (created if missing; schema migrated on start).
        clock: where `now` comes from.
        queue_max: requests accepted but not yet committed, per lane (new work; holder
            calls and maintenance); past it `submit` raises `errors.Overloaded`.
        batch_max: requests per transaction at most.
        busy_timeout_ms: SQLite busy timeout, for outside processes holding the file.
        clock_step_s: a wall-clock step larger than this (either way) re-anchors coordd's
            clock and moves the stored times by it (see the module doc).
        clock_jump_s: a jump ahead larger than this (a suspend) also gives live leases a
            whole lease from the resume (0 = off).
        metrics: where batch sizes, commit times and queue waits are recorded.
        wal_size_limit: bytes the WAL file is cut back to once a checkpoint lets it
            restart (SQLite's journal_size_limit): a WAL a reader let grow shrinks again.
        wal_autocheckpoint_pages: past this many WAL pages the writer checkpoints inside
            its own commit (SQLite's auto-checkpoint): the safety net that lets the WAL
            restart; the background checkpointer keeps it from doing much.
        checkpoint_interval_s: seconds between background PASSIVE checkpoints while
            commits happen (0 = none: every checkpoint runs inside a commit).
        linger_rounds: loop iterations a batch waits while more requests keep arriving
            (0 = run what is queued at once).
    """

    def __init__(self, path: str, clock: Clock, *, queue_max: int = 20_000,
                 batch_max: int = 1024, busy_timeout_ms: int = 10_000,
                 clock_jump_s: float = 60.0, clock_step_s: float = 1.0,
                 metrics: Metrics | None = None,
                 wal_size_limit: int = 64 << 20, wal_autocheckpoint_pages: int = 10_000,
                 checkpoint_interval_s: float = 0.1,
                 linger_rounds: int = LINGER_ROUNDS) -> None:
        self._path = path
        self._clock = anchored(clock)
        self._batch_max = batch_max
        self._busy_timeout_ms = busy_timeout_ms
        self._steps = ClockSteps(self._clock, clock_step_s, clock_jump_s)
        self.metrics = metrics
        self._wal_size_limit = wal_size_limit
        self._wal_autocheckpoint_pages = wal_autocheckpoint_pages
        self._linger_rounds = linger_rounds
        self._lanes = lanes.Lanes(queue_max)  # (op, future, submitted at): new / urgent
        self._wakeup = asyncio.Event()
        self._conn: sqlite3.Connection | None = None
        self._checkpointer = WalCheckpointer(path, checkpoint_interval_s, wal_size_limit)
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.stats = WriterStats()
        self.health = StorageHealth()  # disk full / I/O errors: `unavailable`, logged once
        self.changes = JobChanges()  # status counters, waiting kinds, wake-up rows
        # Commit hooks (coordd.store.sqlite.wakeups): `on_open(conn)` once the schema is migrated; after
        # each batch `on_commit()` once its COMMIT is done, or `on_rollback()`;
        # `on_clock_step(step_s)` after a batch whose COMMIT moved the stored times by a
        # wall-clock step (coordd.store.clock_steps).
        self.on_open: Callable[[sqlite3.Connection], None] | None = None
        self.on_clock_step: Callable[[float], None] | None = None
        self.on_commit: Callable[[], None] | None = None
        self.on_rollback: Callable[[], None] | None = None
        # peers(): how many peers may add requests to a batch (the daemon: its open
        # connections, or its requests in flight if more: rpc.Dispatcher.peers); None:
        # unknown. See `submit` and `_linger`.
        self.peers: Callable[[], int] | None = None
        self._idle = False  # the task waits for requests, none queued
        self._inline_by: object = None  # the task whose step ran the last inline batch
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # start()

    @property
    def queue_depth(self) -> int:
        """Requests accepted and not yet committed (both lanes)."""
        return len(self._lanes)

    async def start(self) -> None:
        """Open the connection (WAL, synchronous=NORMAL, foreign keys, busy timeout),
        migrate the schema and start the writer task. Idempotent.

        Raises:
            errors.StoreError: the file is not a (compatible) coordd SQLite database.
        """
        if self._task is not None:
            return
        # Open once first: a file that cannot be opened fails here, before any connection
        # or thread of ours exists for it.
        await asyncio.to_thread(_probe_open, self._path)
        # check_same_thread=False: opened and migrated in a worker thread (a migration
        # can take a while), used only by the loop's thread afterwards.
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            await asyncio.to_thread(self._setup, conn)
        except BaseException:
            conn.close()
            raise
        if self.on_open is not None:
            try:
                self.on_open(conn)
            except BaseException:
                conn.close()
                raise
        self._conn = conn
        self._checkpointer.start()
        self._closing = False  # started again after a stop: taking requests again
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name="coordd-writer")

    def _setup(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            store.prepare_new_file(conn)  # before WAL and the first table, or it is ignored
            mode = conn.execute(store.PRAGMAS_WRITER[0]).fetchone()[0]
            if mode.lower() != "wal":
                raise errors.StoreError(f"{self._path}: could not enable WAL (mode {mode})")
            for pragma in store.PRAGMAS_WRITER[1:]:
                conn.execute(pragma)
            conn.execute(store.PRAGMA_JOURNAL_SIZE_LIMIT.format(self._wal_size_limit))
            conn.execute(store.PRAGMA_WAL_AUTOCHECKPOINT.format(self._wal_autocheckpoint_pages))
            store.migrate(conn)
            self.changes.open(conn)
            conn.execute("PRAGMA busy_timeout = 0")  # from now on `_begin` waits, not SQLite
        except sqlite3.DatabaseError as exc:
            raise errors.StoreError(f"{self._path}: {exc}") from exc

    def submit(self, op: WriteOp, urgent: bool = False) -> asyncio.Future[Any]:
        """Queue `op` for the next group commit; return the future of its result.

        `urgent`: a holder call (or maintenance: also inside `maintenance()`); it goes in
        the urgent lane, bounded apart from new work and committed first.

        When the writer is idle, nothing is queued and `peers()` says no other peer could
        join the batch, the op's batch runs now, in the caller's step (COMMIT first, then
        the future resolves; a task's second in a row goes to the writer's task, so a
        caller that submits in a loop still yields): no hand-off, no loop turns.

        Raises:
            errors.Overloaded: the op's lane is full, or the writer is shutting down.
        """
        if self._closing or self._task is None:
            raise errors.Overloaded("writer is not accepting requests (shutting down)")
        fut: asyncio.Future[Any] = self._loop.create_future()
        item = (op, fut, self._clock.mono())
        if self._idle and not self._lanes and self.peers is not None and self.peers() <= 1 \
                and self._run_inline(item):
            return fut  # resolved: no other request could have joined its batch
        self._lanes.add(item, urgent)
        self._wakeup.set()
        return fut

    async def run(self, op: WriteOp, urgent: bool = False) -> Any:
        """Submit `op` and await its result (its CoordError is raised here)."""
        return await self.submit(op, urgent)

    async def checkpoint(self) -> tuple[int, int, int]:
        """Copy the WAL into the database file now, without waiting for readers (after a
        prune, so the file shrinks); on the checkpointer's thread and connection. SQLite's
        (busy, log frames, checkpointed frames).

        Raises:
            errors.Overloaded: the writer is not running.
        """
        if self._conn is None:
            raise errors.Overloaded("writer is not running")
        return await asyncio.to_thread(self._checkpointer.run_now)

    async def wait_dead(self, stop: asyncio.Event) -> None:
        """Return once `stop` is set; if the writer task ends first, raise.

        Raises:
            errors.StoreError: the writer task ended while coordd was not stopping.
        """
        task = self._task
        if task is None:
            return
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if task.done() and not self._closing:
            exc = None if task.cancelled() else task.exception()
            raise errors.StoreError(f"the writer task ended: {exc!r}") from exc

    async def stop(self) -> None:
        """Stop intake, commit everything already accepted, close the connection. Idempotent."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            try:
                await self._task
            finally:
                self._task = None
        await asyncio.to_thread(self._checkpointer.stop)
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                conn.execute(store.PRAGMA_CHECKPOINT_TRUNCATE)
            except sqlite3.Error as exc:  # readers still open: the WAL is folded next time
                logger.warning("WAL checkpoint at close failed: %s", exc)
            finally:
                conn.close()

    async def _run(self) -> None:
        conn = self._conn
        assert conn is not None
        queued = self._lanes
        while True:
            if not queued:
                if self._closing:
                    return
                self._wakeup.clear()
                self._idle = True  # `submit` may run a lone request inline meanwhile
                try:
                    await self._wakeup.wait()
                finally:
                    self._idle = False
                    self._inline_by = None  # the loop turned
                continue
            await self._linger()
            batch = queued.take(self._batch_max)
            started = self._clock.mono()
            try:
                ck = self._checkpointer
                if ck.wal_over_bound or ck.low_space and ck.check_bound():
                    await self._cut_wal(conn)  # before the batch can grow the WAL further
                await self._begin(conn)
            except Exception as exc:  # nothing of the batch is stored
                settle_futures(batch, self._refused(exc, len(batch)))
            else:
                self._commit(conn, batch, started)
            await asyncio.sleep(0)  # let the loop read sockets: the next batch is what came

    def _run_inline(self, item: lanes.Queued) -> bool:
        """Run a lone request's batch now, in the caller's step (see `submit`); False if it
        cannot start at once (a WAL to cut first, BEGIN IMMEDIATE refused): the writer's
        task takes it then, and says why if it fails."""
        conn = self._conn
        ck = self._checkpointer
        by = asyncio.current_task(self._loop) or self  # (a callback: not a task)
        if conn is None or ck.wal_over_bound or ck.low_space or by is self._inline_by:
            return False  # (a task's second in a row goes the task's way: it yields)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:
            return False
        self._idle = False  # a submit from a commit hook is queued for the writer's task
        self._inline_by = by
        try:
            self._commit(conn, [item], item[2])
        finally:
            self._idle = not self._lanes and not self._closing
        return True

    def _commit(self, conn: sqlite3.Connection, batch: list[lanes.Queued],
                started: float) -> None:
        """Run `batch` in the open transaction, COMMIT, run the commit hooks, then resolve
        its futures (a failed COMMIT: every future gets the batch's error)."""
        try:
            outcomes = self._apply(conn, batch)
            if self.on_commit is not None:
                self.on_commit()  # wake-ups after the COMMIT, never before (service.push)
            self._checkpointer.kick()
            if self.metrics is not None:
                self.metrics.observe_batch(len(batch), self.stats.commit_times[-1],
                                            [started - t for _, _, t in batch])
        except Exception as exc:  # the whole transaction failed: nothing of it is stored
            outcomes = self._refused(exc, len(batch))
        else:
            if self.health.reason is not None:
                self.health.committed(self._clock.mono())
        settle_futures(batch, outcomes)

    def _refused(self, exc: Exception, n: int) -> list[tuple[bool, Any]]:
        """The outcomes of a batch of `n` whose transaction failed: a storage refusal
        (`unavailable`, logged once) or the batch's error (logged)."""
        reason = storage_reason(exc)
        if reason is not None:
            err = self.health.refuse(exc, reason, n, self._clock.wall(), self._clock.mono())
            self._checkpointer.kick()  # a WAL past its bound is cut once space allows
        else:
            logger.error("group commit failed: %s", exc,
                         extra={"action": "commit_failed", "n": n})
            err = batch_error(exc)
        if self.on_rollback is not None:
            self.on_rollback()
        return [(False, err)] * n

    async def _cut_wal(self, conn: sqlite3.Connection) -> None:
        """Checkpoint with TRUNCATE on the writer's own connection (in a thread; no batch runs
        meanwhile): the WAL went past its bound (coordd.store.sqlite.checkpointer). Readers on
        an older snapshot make it busy (busy_timeout is 0: nothing waits) and the batch goes on;
        the checkpointer says so again after its next round.

        Raises:
            sqlite3.Error: a storage refusal (the disk is still full): the batch is refused
                with it, since its commit could only grow the WAL into the space the
                checkpoint needs; the next batch tries again.
        """
        try:
            busy, _log, _done = await asyncio.to_thread(
                lambda: conn.execute(store.PRAGMA_CHECKPOINT_TRUNCATE).fetchone())
        except sqlite3.Error as exc:
            if storage_reason(exc) is not None:
                raise
            logger.warning("WAL TRUNCATE checkpoint failed: %s", exc,
                           extra={"action": "wal_cut_failed"})
            busy = 1
        self._checkpointer.wal_over_bound = False
        if not busy:
            self.stats.wal_cuts += 1

    async def _linger(self) -> None:
        """Yield to the loop while each iteration brings more requests, at most
        `linger_rounds` times or until a full batch, or one from every peer, is queued."""
        queued = self._lanes
        peers = self.peers
        for _ in range(self._linger_rounds):
            n = len(queued)
            if n >= self._batch_max or peers is not None and n >= peers():
                return
            await asyncio.sleep(0)
            if len(queued) == n:
                return

    async def _begin(self, conn: sqlite3.Connection) -> None:
        """BEGIN IMMEDIATE; while another process holds the write lock, retry after asyncio
        sleeps (1 ms doubling to 50 ms) so the loop keeps serving reads and heartbeats,
        until the sleeps add up to `busy_timeout_ms`; then the OperationalError propagates
        (the batch gets `overloaded`, see batch_apply.batch_error)."""
        budget_s = self._busy_timeout_ms / 1000
        delay = 0.001
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if budget_s <= 0:
                    raise
            await asyncio.sleep(min(delay, budget_s))
            budget_s -= delay
            delay = min(delay * 2, 0.05)


def _probe_open(path: str) -> None:
    """Open `path` and read its schema version; raise StoreError if SQLite cannot.

    Raises:
        errors.StoreError: the file cannot be opened or is not a database.
    """
    try:
        conn = sqlite3.connect(path)
        try:
            conn.execute("PRAGMA schema_version").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise errors.StoreError(f"{path}: {exc}") from exc
