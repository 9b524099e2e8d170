"""Enrolment tokens on SQLite (coordd.store.api_enrol.EnrolStore): coordd.store.enrol's
functions as ops of the single writer, reads on the read pool.

`SQLiteEnrolOps` is a mixin of SQLiteStore (its `writer`, `readers` and `_clock`).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from coordd import errors
from coordd.clock import Clock
from coordd.store.sqlite.readers import ReadPool
from coordd.store import enrol as estore
from coordd.store.api_enrol import TokenState
from coordd.store.sqlite.writer import Writer


class SQLiteEnrolOps:
    """EnrolStore over the single writer (see the module docstring)."""

    writer: Writer
    readers: ReadPool
    _clock: Clock

    async def _enrol_write(self, fn: Any, now: float | None) -> Any:
        if now is None:
            return await self.writer.run(fn)
        return await self.writer.run(lambda conn, _now: fn(conn, now))

    async def add_token(self, digest: str, worker_id: str, ttl_s: float, *,
                        now: float | None = None) -> float:
        """coordd.store.enrol.add_token in one op; return expires_at."""
        def op(conn: sqlite3.Connection, t: float) -> float:
            estore.add_token(conn, t, digest, worker_id, t + ttl_s)
            return t + ttl_s
        return await self._enrol_write(op, now)

    async def token_state(self, digest: str, *, now: float | None = None
                          ) -> tuple[TokenState | None, float]:
        """The token's state on the read pool, and coordd's clock (or `now`)."""
        t = self._clock.wall() if now is None else now
        return await self.readers.run(estore.token_state, digest), t

    async def burn_token(self, digest: str, serial: str, *, now: float | None = None) -> None:
        """Check (coordd.store.enrol.usable) and use the token in one op.
        Raises: errors.PermissionDenied."""
        def op(conn: sqlite3.Connection, t: float) -> None:
            estore.usable(estore.token_state(conn, digest), t)
            if not estore.use_token(conn, t, digest, serial):
                raise errors.PermissionDenied("enroll: this token was already used")
        await self._enrol_write(op, now)
