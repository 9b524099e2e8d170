"""A job's captured output in the store interface (coordd.store.api): `log_append`
(fenced like `checkpoint`) and `job_logs` (by cursor), bounded as coordd.store.logs says.

Every call takes `now` (None in production: the store's clock). Checks of streams,
offsets and sizes are coordd.service.logs', made before a store is called.
"""

from __future__ import annotations

from typing import Protocol

from coordd.wire.logs import JobLogs
from coordd.store.api import LeaseRef


class LogStore(Protocol):
    """The log operations over one database (see the module docstring)."""

    async def log_append(self, ref: LeaseRef, stream: str, pos: int, data: bytes, *,
                         now: float | None = None) -> bool:
        """Store bytes `pos..pos+len(data)` of `stream` of the attempt holding `ref`, then
        trim past the bounds; False: that chunk was stored already (a resend).

        Raises: errors.LeaseLost, LeaseExpired, NotFound, AlreadyCompleted (the fence).
        """
        ...

    async def job_logs(self, job_id: str, after: int, attempt: int | None,
                       limit_bytes: int, *, now: float | None = None) -> JobLogs:
        """The job's kept chunks after cursor `after` (chunk seq) in seq order, up to
        `limit_bytes` of data (one chunk at least), `attempt`'s only if given; the job's
        status is read first. Raises: errors.NotFound (no such job)."""
        ...


__all__ = ["LogStore"]
