"""Wake-ups and leadership on dedicated connections (neither may share a pool connection:
a LISTEN lives in its session, and so does a session advisory lock).

LISTEN/NOTIFY is only a hint: a NOTIFY is delivered at its transaction's commit and never
replayed, so a new session (the first one too) means "look again", and its listeners
still look on a long safety interval (coordd.store.postgres.hooks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg

from coordd.store.postgres.leader import Leadership
from coordd.store.postgres.push_sql import PUSH_CHANNEL, WORK_CHANNEL

logger = logging.getLogger(__name__)


class WorkListener:
    """`LISTEN coordd_work` and `LISTEN coordd_push` on its own connection, opened on
    first use. `on_work(payload)` takes each coordd_work NOTIFY's payload and `on_push`
    each coordd_push one (coordd.store.postgres.push_sql); `on_push("*")` whenever a new
    session opens, since NOTIFYs sent while none listened are gone."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: Any = None
        self._event = asyncio.Event()  # a coordd_work NOTIFY came (`wait`)
        self._ended = asyncio.Event()  # the session ended (`keep`)
        self._lock = asyncio.Lock()
        self.missed = False  # a session failed to open: NOTIFYs go unheard
        self.on_work: Callable[[str], None] | None = None
        self.on_push: Callable[[str], None] | None = None

    def _heard(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self._event.set()
        if self.on_work is not None:
            self.on_work(payload)

    def _pushed(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if self.on_push is not None:
            self.on_push(payload)

    def _lost(self, _conn: Any) -> None:
        self._ended.set()

    async def _open(self, timeout: float) -> bool | None:
        """Listen on a live session: True when a new one was opened (the first one too),
        False when the last one still lives, None when none could be opened (after
        waiting out `timeout`)."""
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                return False
            lost = self._conn is not None
            self._conn = None
            try:
                conn = await asyncio.wait_for(asyncpg.connect(self._dsn), timeout)
                await conn.add_listener(WORK_CHANNEL, self._heard)
                await conn.add_listener(PUSH_CHANNEL, self._pushed)
                conn.add_termination_listener(self._lost)
            except (OSError, TimeoutError, asyncpg.PostgresError,
                    asyncpg.InterfaceError) as exc:
                logger.warning("cannot LISTEN for work; polling",
                               extra={"action": "listen_failed", "error": str(exc)})
                self.missed = True
                await asyncio.sleep(timeout)
                return None
            self._conn = conn
            self._ended.clear()
            if lost:
                logger.info("LISTEN session replaced", extra={"action": "relisten"})
            self.missed = False
            if self.on_push is not None:
                self.on_push("*")  # the parked calls' NOTIFYs went unheard meanwhile
            return True

    async def wait(self, timeout: float) -> bool:
        """True when a coordd_work NOTIFY came (since the last call returned), False at
        `timeout`.

        A lost LISTEN session is replaced on the next call, which then returns True at
        once: NOTIFYs sent while nobody listened are gone, so the caller looks now. With
        the server unreachable it waits out `timeout` and returns False (the caller polls,
        and its claim says `unavailable`)."""
        was = self._conn
        opened = await self._open(timeout)
        if opened is None:
            return False
        if opened and was is not None:
            return True
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            return False
        self._event.clear()
        return True

    async def keep(self, timeout: float, retry_s: float) -> str:
        """Keep a session listening; return why it returned: "opened" (a new session, the
        first one too), "ended" (it ended), "timeout", or "failed" (none could be opened,
        after `retry_s`)."""
        opened = await self._open(retry_s)
        if opened is None:
            return "failed"
        if opened:
            return "opened"
        try:
            await asyncio.wait_for(self._ended.wait(), timeout)
        except TimeoutError:
            return "timeout"
        return "ended"

    async def close(self) -> None:
        """Close the listening connection. Idempotent."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.remove_termination_listener(self._lost)
            await conn.close()


@contextlib.asynccontextmanager
async def leadership(dsn: str, key: str,
                     on_lost: Callable[[], None] | None = None) -> AsyncIterator[bool]:
    """Try for the session advisory lock named `key` (coordd.store.postgres.leader, the
    one implementation the standby uses too); yield whether it was won. It is held until
    the block ends, or until its session ends: a crashed leader's lock goes with its
    session. A won lock whose session ends before the block does (terminated, server
    restarted, a probe unanswered) calls `on_lost` at once: the lock is gone and a
    standby may hold it already."""
    lock = Leadership(dsn, key)
    won = await lock.try_acquire()
    watcher = None
    if won:  # the watch's probes also keep the session from its idle timeout
        async def watch() -> None:
            reason = await lock.watch()
            logger.warning("leadership session lost (%s)", reason,
                           extra={"action": "leadership_lost", "key": key})
            if on_lost is not None:
                on_lost()
        watcher = asyncio.create_task(watch())
    try:
        yield won
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await lock.close()
