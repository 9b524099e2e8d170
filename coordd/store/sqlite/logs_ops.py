"""A job's captured output on SQLite (coordd.store.api_logs.LogStore): coordd.store.logs'
functions as ops of the single writer, reads on the read pool.

`SQLiteLogOps` is a mixin of SQLiteStore (its `writer` and `readers`). A pinned `now`
replaces the writer's.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from coordd.store.sqlite import leases
from coordd.wire.logs import JobLogs
from coordd.store.sqlite.readers import ReadPool
from coordd.store import logs as log_store
from coordd.store.api import LeaseRef
from coordd.store.sqlite.writer import Writer


class SQLiteLogOps:
    """LogStore over the single writer (see the module docstring)."""

    writer: Writer
    readers: ReadPool

    async def _logs_write(self, fn: Any, now: float | None) -> Any:
        if now is None:
            return await self.writer.run(fn)
        return await self.writer.run(lambda conn, _now: fn(conn, now))

    async def log_append(self, ref: LeaseRef, stream: str, pos: int, data: bytes, *,
                         now: float | None = None) -> bool:
        """Fence (coordd.store.sqlite.leases.fence), then coordd.store.logs.append, in one op."""
        def op(conn: sqlite3.Connection, t: float) -> bool:
            attempt = leases.fence(conn, t, ref.job_id, ref.worker_id, ref.token)
            return log_store.append(conn, t, ref.job_id, ref.token, attempt, ref.worker_id,
                                    stream, pos, data)
        return await self._logs_write(op, now)

    async def job_logs(self, job_id: str, after: int, attempt: int | None,
                       limit_bytes: int, *, now: float | None = None) -> JobLogs:
        """coordd.store.logs.read on the read pool. Raises: errors.NotFound."""
        status, rows, more = await self.readers.run(log_store.read, job_id, after, attempt,
                                                    limit_bytes)
        return log_store.view(job_id, after, status, rows, more)
