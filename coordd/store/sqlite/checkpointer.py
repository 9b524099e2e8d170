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

The rule not to break: the WAL must never hold more bytes than the disk has free, or a
checkpoint (which grows the database file by the WAL's new pages) cannot complete once the
disk fills, the WAL cannot restart, and the disk stays full after space returns. After
each checkpoint the thread compares the WAL file with its bound (`wal_bound`: the
configured WAL size limit, and half the file system's free space) and, past it, sets
`wal_over_bound`; the writer then checkpoints with TRUNCATE on its own connection before
its next batch (another connection's TRUNCATE would look like an outside write to it).
While free space is under LOW_SPACE_BYTES (`low_space`) the writer checks the bound
before every batch itself (two syscalls), since a round every `interval_s` lets a busy
drain pass it. While the disk refuses writes the writer kicks the thread too.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading

from coordd.store import upkeep

logger = logging.getLogger(__name__)

WAL_FREE_SHARE = 0.5  # the WAL is kept under this share of the file system's free bytes
LOW_SPACE_BYTES = 1 << 30  # under this much free space the bound is checked every batch


class WalCheckpointer:
    """Run PASSIVE WAL checkpoints of `path` on a daemon thread.

    Args:
        path: the SQLite database (already in WAL mode).
        interval_s: seconds between checkpoints while `kick()` is called; 0 = no thread
            (`run_now` still works).
        wal_size_limit: bytes; a WAL file past min(this, WAL_FREE_SHARE of the free
            space) sets `wal_over_bound` (None: only the free space bounds it).
    """

    def __init__(self, path: str, interval_s: float, wal_size_limit: int | None = None) -> None:
        self._path = path
        self._interval_s = interval_s
        self._wal_size_limit = wal_size_limit
        self.wal_over_bound = False  # set by the thread; the writer clears it (see above)
        self.low_space = False  # free bytes under LOW_SPACE_BYTES at the last look
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
        """Note that a commit happened (cheap; call after every commit)."""
        if not self._dirty.is_set():  # set() takes the Event's lock and notifies: per commit
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
            return upkeep.wal_checkpoint(self._conn)

    def wal_bound(self) -> int:
        """The WAL file's bound now, in bytes: the configured limit, and WAL_FREE_SHARE of
        the free bytes of the file system that holds it (0 when it is full)."""
        try:
            st = os.statvfs(os.path.dirname(os.path.abspath(self._path)))
        except OSError:
            free = None
        else:
            free = st.f_bavail * st.f_frsize
            self.low_space = free < LOW_SPACE_BYTES
            free = int(free * WAL_FREE_SHARE)
        bounds = [b for b in (self._wal_size_limit, free) if b is not None]
        return min(bounds) if bounds else 1 << 62

    def check_bound(self) -> bool:
        """Set (and return) `wal_over_bound`: the WAL file is past `wal_bound()`."""
        try:
            size = os.path.getsize(self._path + "-wal")
        except OSError:
            return False
        self.wal_over_bound = over = size > self.wal_bound()
        return over

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
            self.check_bound()
            if self._stopping.wait(self._interval_s):
                return
