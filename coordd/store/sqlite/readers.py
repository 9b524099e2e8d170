"""The read side's connections: a small pool of read-only SQLite connections, each on its
own thread (aiosqlite), and a bounded queue of reads waiting for one.

WAL lets every reader run beside the writer and beside each other, so one slow read (an
integrity check, a large page) holds one connection, not every read. Heavy reads may
take all connections but one, which stays for the quick ones (`status`, `get_job`). A
read that finds the queue full is refused at once with `overloaded` instead of waiting
behind hundreds of others until its client gives up.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sqlite3
from collections.abc import Callable
from typing import Any

import aiosqlite

from coordd import errors

logger = logging.getLogger(__name__)

READ_CONNECTIONS_DEFAULT = 4
READ_QUEUE_MAX_DEFAULT = 256


class ReadPool:
    """`size` read-only connections to `path`; reads beyond them wait, `queue_max` at most.

    Args:
        path: the SQLite file (it must exist: the writer creates it first).
        size: connections (threads), >= 1.
        queue_max: reads waiting for a connection before new ones get `overloaded`.
        busy_timeout_ms: SQLite's busy timeout on each connection.
    """

    def __init__(self, path: str, size: int = READ_CONNECTIONS_DEFAULT,
                 queue_max: int = READ_QUEUE_MAX_DEFAULT, busy_timeout_ms: int = 10_000) -> None:
        if size < 1 or queue_max < 0:
            raise ValueError("a read pool needs size >= 1 and queue_max >= 0")
        self._path = path
        self._size = size
        self._queue_max = queue_max
        self._busy_timeout_ms = busy_timeout_ms
        self._conns: list[aiosqlite.Connection] = []
        self._idle: list[aiosqlite.Connection] = []
        self._waiters: collections.deque[tuple[asyncio.Future[aiosqlite.Connection], bool]] = \
            collections.deque()
        self._heavy = 0  # connections held by heavy reads now
        self.refused = 0  # reads refused with `overloaded` (for metrics and tests)

    @property
    def waiting(self) -> int:
        """Reads queued for a connection now."""
        return len(self._waiters)

    async def start(self) -> None:
        """Open every connection (read-only, autocommit).

        Raises:
            sqlite3.Error: a connection cannot be opened (the pool is closed again).
        """
        try:
            for _ in range(self._size):
                conn = await aiosqlite.connect(f"file:{self._path}?mode=ro", uri=True,
                                               isolation_level=None)
                self._conns.append(conn)
                await conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
        except BaseException:
            await self.close()
            raise
        self._idle = list(self._conns)

    async def close(self) -> None:
        """Close every connection; reads still waiting get `overloaded`. Idempotent."""
        conns, self._conns, self._idle = self._conns, [], []
        while self._waiters:
            fut, _heavy = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(errors.Overloaded("coordd is shutting down"))
        for conn in conns:
            try:
                await conn.close()
            except sqlite3.Error as exc:  # closing must go on for the others
                logger.warning("closing a read connection failed: %s", exc)

    async def run(self, fn: Callable[..., Any], *args: Any, heavy: bool = False) -> Any:
        """Run `fn(conn, *args)` on a free connection's thread; return its result.

        `heavy` marks a read that may take long (an integrity check, a large page): it
        never takes the last free connection.

        Raises:
            errors.Overloaded: `queue_max` reads already wait for a connection.
            errors.CoordError: the pool is not started (or closed).
        """
        if not self._conns:
            raise errors.CoordError("coordinator is not started")
        conn = self._take(heavy)
        if conn is None:
            if len(self._waiters) >= self._queue_max:
                self.refused += 1
                raise errors.Overloaded(
                    f"{len(self._waiters)} reads already wait for the {self._size} read "
                    "connection(s); retry later")
            fut: asyncio.Future[aiosqlite.Connection] = \
                asyncio.get_running_loop().create_future()
            self._waiters.append((fut, heavy))
            try:
                conn = await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    self._give_back(fut.result(), heavy)  # handed over as we were cancelled
                else:
                    self._forget(fut)
                raise
        try:
            return await conn._execute(fn, conn._conn, *args)
        finally:
            self._give_back(conn, heavy)

    def _take(self, heavy: bool) -> aiosqlite.Connection | None:
        if not self._idle or (heavy and self._heavy >= self._size - 1 and self._size > 1):
            return None
        if heavy:
            self._heavy += 1
        return self._idle.pop()

    def _give_back(self, conn: aiosqlite.Connection, heavy: bool) -> None:
        if heavy:
            self._heavy -= 1
        if conn not in self._conns:
            return  # closed meanwhile
        self._idle.append(conn)
        self._hand_over()

    def _hand_over(self) -> None:
        """Give idle connections to the oldest waiters that may take them."""
        for item in list(self._waiters):
            if not self._idle:
                return
            fut, heavy = item
            if fut.done():
                self._waiters.remove(item)
                continue
            conn = self._take(heavy)
            if conn is None:
                continue  # a heavy read that must leave the last connection free
            self._waiters.remove(item)
            fut.set_result(conn)

    def _forget(self, fut: asyncio.Future[aiosqlite.Connection]) -> None:
        for item in self._waiters:
            if item[0] is fut:
                self._waiters.remove(item)
                return

