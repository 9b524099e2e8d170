"""WAL checkpoints off the writer's path: a thread with its own connection.

In WAL mode a COMMIT only appends to the WAL (no fsync with synchronous=NORMAL); the
expensive part is the checkpoint, which copies WAL pages into the database file and
fsyncs both. Left to SQLite's auto-checkpoint it runs inside whichever COMMIT crosses the
page threshold, and every request of that batch, and the whole event loop, waits for it:
that was the claim p99 at 16 clients (6.3 ms against 4.3 ms with this thread; issue 6,
`python -m bench.run --jobs 8000 --rounds 3 --clients 16`). Here a thread runs a PASSIVE
checkpoint (never waits for readers nor blocks the writer) at most every `interval_s`
while commits happen, so the writer's own auto-checkpoint finds little left to copy.
The GIL is released while SQLite works, so the loop keeps serving meanwhile.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

from coordd import store

logger = logging.getLogger(__name__)


class WalCheckpointer:
    """Run PASSIVE WAL checkpoints of `path` on a daemon thread.

    Args:
        path: the SQLite database (already in WAL mode).
        interval_s: seconds between checkpoints while `kick()` is called; 0 = no thread
            (`run_now` still works).
    """

    def __init__(self, path: str, interval_s: float) -> None:
        self._path = path
        self._interval_s = interval_s
        self._dirty = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # one checkpoint at a time on the connection
        self._conn: sqlite3.Connection | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Open the connection and start the thread (idempotent)."""
        if self._conn is None:
            self._conn = sqlite3.connect(self._path, isolation_level=None,
                                         check_same_thread=False)
        if self._interval_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="coordd-checkpointer",
                                            daemon=True)
            self._thread.start()

    def kick(self) -> None:
        """Note that a commit happened (cheap: one Event.set; call after every commit)."""
        self._dirty.set()

    def run_now(self) -> tuple[int, int, int]:
        """Checkpoint now (blocking; call from a worker thread). SQLite's (busy, log frames,
        checkpointed frames).

        Raises:
            sqlite3.Error: from SQLite.
        """
        with self._lock:
            if self._conn is None:
                raise sqlite3.ProgrammingError("checkpointer is not started")
            return store.wal_checkpoint(self._conn)

    def stop(self) -> None:
        """Stop the thread and close the connection (blocking; idempotent)."""
        self._stopping.set()
        self._dirty.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _loop(self) -> None:
        failures = 0  # in a row: the first is logged, the rest only counted (a full disk)
        while True:
            self._dirty.wait()
            if self._stopping.is_set():
                return
            self._dirty.clear()
            try:
                self.run_now()
            except sqlite3.Error as exc:  # e.g. a full disk; the writer reports that
                failures += 1
                logger.log(logging.WARNING if failures == 1 else logging.DEBUG,
                           "background WAL checkpoint failed: %s (repeats not logged)", exc,
                           extra={"action": "checkpoint_failed"})
            else:
                if failures:
                    logger.info("background WAL checkpoints work again after %d failure(s)",
                                failures, extra={"action": "checkpoint_recovered"})
                failures = 0
            if self._stopping.wait(self._interval_s):
                return
