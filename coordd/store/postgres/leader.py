"""The standby's side of leadership: wait for the coordinator's session advisory lock, and
notice at once when the session holding it ends.

The rule not to break: the lock lives in one session, on a connection of its own; when
that session is gone (the server ended it, the network dropped it, a probe timed out),
leadership is gone too and the caller must stop serving before anything else.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg

from coordd.store.postgres import sql

logger = logging.getLogger(__name__)

SQL_WAIT_LEADER = "SELECT pg_advisory_lock(hashtext($1))"  # same key as sql.SQL_TRY_LEADER
SQL_PROBE = "SELECT 1"
SESSION_TIMEOUT_S_DEFAULT = 5.0
RETRY_S = 1.0
_LOST = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)


def pool_settings(session_timeout_s: float) -> dict[str, str]:
    """Server settings for the store's pool sessions: a session left inside a transaction
    (its coordd frozen or cut off between two statements, row locks held) is ended by the
    server after `session_timeout_s`, and TCP keepalives notice a silent peer in about as
    long, so a lost active's locks never outlive the fail-over."""
    ms, ka = int(session_timeout_s * 1000), max(1, int(session_timeout_s / 3))
    return {"idle_in_transaction_session_timeout": str(ms), "tcp_keepalives_idle": str(ka),
            "tcp_keepalives_interval": str(ka), "tcp_keepalives_count": "2"}


class Leadership:
    """The coordinator's session advisory lock on a dedicated connection.

    Args:
        dsn: the store's DSN (its keepalive settings decide how soon a dead server or a
            partition is noticed; docs/guides/postgresql.md).
        key: the lock's name (hashed by PostgreSQL's `hashtext`).
        session_timeout_s: the server ends the lock's session once it is silent this long
            (`idle_session_timeout`, and TCP keepalives of about the same span), freeing
            the lock of a frozen or cut-off holder; the holder probes every third of it,
            and a probe unanswered within a third ends its leadership.
    """

    def __init__(self, dsn: str, key: str = "coordd",
                 session_timeout_s: float = SESSION_TIMEOUT_S_DEFAULT) -> None:
        self._dsn, self._key = dsn, key
        self._probe_s = session_timeout_s / 3
        self._settings = {**pool_settings(session_timeout_s),
                          "idle_session_timeout": str(int(session_timeout_s * 1000)),
                          "application_name": "coordd-leader"}
        self._conn: Any = None
        self._gone = asyncio.Event()

    async def _connect(self) -> Any:
        return await asyncpg.connect(self._dsn, server_settings=self._settings)

    async def try_acquire(self) -> bool:
        """Take the lock if it is free; False if another session holds it."""
        conn = await self._connect()
        if await conn.fetchval(sql.SQL_TRY_LEADER, self._key):
            self._hold(conn)
            return True
        await conn.close()
        return False

    async def acquire(self) -> None:
        """Wait until this session holds the lock: the server grants it the moment the
        holder's session ends. A lost connection while waiting is retried after RETRY_S."""
        while True:
            conn = None
            try:
                conn = await self._connect()
                await conn.fetchval(SQL_WAIT_LEADER, self._key, timeout=None)
            except _LOST as exc:
                logger.warning("standby: lock connection failed (%s); retrying", exc,
                               extra={"action": "standby_retry"})
                if conn is not None:
                    conn.terminate()
                await asyncio.sleep(RETRY_S)
                continue
            self._hold(conn)
            return

    def _hold(self, conn: Any) -> None:
        self._conn = conn
        conn.add_termination_listener(lambda _c: self._gone.set())

    async def watch(self) -> str:
        """Return (with the reason) once the lock's session is gone: the connection closed,
        or a probe failed or took longer than a third of the session timeout."""
        conn = self._conn
        while not self._gone.is_set():
            try:
                await conn.fetchval(SQL_PROBE, timeout=self._probe_s)
            except _LOST as exc:
                return f"lock connection lost: {type(exc).__name__}: {exc}"
            try:
                await asyncio.wait_for(self._gone.wait(), self._probe_s)
            except TimeoutError:
                continue
        return "lock connection closed"

    async def close(self) -> None:
        """Give the lock back (close its session). Idempotent."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await asyncio.wait_for(conn.close(), 2.0)
            except (TimeoutError, *_LOST):
                conn.terminate()
