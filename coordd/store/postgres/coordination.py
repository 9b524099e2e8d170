"""Wake-ups and leadership on dedicated connections (neither may share a pool connection:
a LISTEN lives in its session, and so does a session advisory lock).

LISTEN/NOTIFY is only a hint: a NOTIFY is delivered at its transaction's commit and never
replayed, so `wait_for_work` callers poll too (the timeout is their backstop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg

from coordd.store.postgres import sql

logger = logging.getLogger(__name__)


class WorkListener:
    """`LISTEN coordd_work` on its own connection, opened on first use."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: Any = None
        self._event = asyncio.Event()
        self._lock = asyncio.Lock()

    def _heard(self, *_args: Any) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> bool:
        """True when a NOTIFY came (since the last call returned), False at `timeout`.

        A lost LISTEN session is replaced on the next call, which then returns True at
        once: NOTIFYs sent while nobody listened are gone, so the caller looks now. With
        the server unreachable it waits out `timeout` and returns False (the caller polls,
        and its claim says `unavailable`)."""
        async with self._lock:
            if self._conn is None or self._conn.is_closed():
                lost = self._conn is not None
                self._conn = None
                try:
                    conn = await asyncio.wait_for(asyncpg.connect(self._dsn), timeout)
                    await conn.add_listener(sql.NOTIFY_CHANNEL, self._heard)
                except (OSError, TimeoutError, asyncpg.PostgresError,
                        asyncpg.InterfaceError) as exc:
                    logger.warning("cannot LISTEN for work; polling",
                                   extra={"action": "listen_failed", "error": str(exc)})
                    await asyncio.sleep(timeout)
                    return False
                self._conn = conn
                if lost:
                    logger.info("LISTEN session replaced", extra={"action": "relisten"})
                    self._event.set()
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            return False
        self._event.clear()
        return True

    async def close(self) -> None:
        """Close the listening connection. Idempotent."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            await conn.close()


@contextlib.asynccontextmanager
async def leadership(dsn: str, key: str,
                     on_lost: Callable[[], None] | None = None) -> AsyncIterator[bool]:
    """Try for the session advisory lock named `key` on a new connection; yield whether
    it was won. It is held until the block ends (the connection closes), or until the
    server ends the session: a crashed leader's lock goes with its session. A won lock's
    session ending before the block does (terminated, server restarted) calls `on_lost`
    at once: the lock is gone and a standby may hold it already. A silent network
    partition is seen only as TCP keepalives or the server's timeouts detect it."""
    conn = await asyncpg.connect(dsn)
    def lost(_conn: Any) -> None:
        logger.warning("leadership session lost", extra={"action": "leadership_lost",
                                                         "key": key})
        if on_lost is not None:
            on_lost()
    try:
        won = bool(await conn.fetchval(sql.SQL_TRY_LEADER, key))
        if won:
            conn.add_termination_listener(lost)
        yield won
    finally:
        conn.remove_termination_listener(lost)
        await conn.close()
