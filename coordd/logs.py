"""A job's captured model output: the supervisor ships each attempt's stdout and stderr in
chunks (`log_append`, fenced like `checkpoint`), `coordctl logs` reads them (`job_logs`).

Bounded where it is stored (coordd.store.logs: the tail of each stream of each attempt,
the newest attempts of a job), and pruned with its job. Validation happens here, before
anything is queued; every write goes through the Writer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from coordd import errors, leases
from coordd.protocol_logs import (
    LOG_CHUNK_MAX_BYTES, LOG_READ_MAX_BYTES, LOG_STREAMS, JobLogs, JobLogsQuery, LogAppend,
    LogAppendResult, LogChunk,
)
from coordd.store import logs as log_store
from coordd.writer import Writer

logger = logging.getLogger(__name__)

POS_MAX = 1 << 62  # byte offsets beyond this are refused (SQLite integers are signed 64-bit)

Reader = Callable[..., Awaitable[Any]]


class JobLogStore:
    """`log_append` and `job_logs` over the coordinator's writer and read connection."""

    def __init__(self, writer: Writer, read: Reader) -> None:
        self._writer = writer
        self._read = read

    async def log_append(self, p: LogAppend) -> LogAppendResult:
        """Store one chunk of an attempt's output.

        Raises:
            errors.BadRequest: an unknown stream, a negative or huge `pos`, empty data.
            errors.PayloadTooLarge: more than LOG_CHUNK_MAX_BYTES of data.
            errors.LeaseLost, LeaseExpired, NotFound, AlreadyCompleted: as `checkpoint`.
        """
        if p.stream not in LOG_STREAMS:
            raise errors.BadRequest(f"stream must be one of {', '.join(LOG_STREAMS)}")
        if not 0 <= p.pos <= POS_MAX:
            raise errors.BadRequest(f"pos must be 0..{POS_MAX}, got {p.pos}")
        if not p.data:
            raise errors.BadRequest("data is empty")
        if len(p.data) > LOG_CHUNK_MAX_BYTES:
            raise errors.PayloadTooLarge(
                f"log chunk is {len(p.data)} bytes, over {LOG_CHUNK_MAX_BYTES}")

        def op(conn: Any, now: float) -> bool:
            attempt = leases.fence(conn, now, p.job_id, p.worker_id, p.token)
            return log_store.append(conn, now, p.job_id, p.token, attempt, p.worker_id,
                                    p.stream, p.pos, p.data)
        return LogAppendResult(stored=await self._writer.run(op))

    async def job_logs(self, p: JobLogsQuery) -> JobLogs:
        """A job's kept output after cursor `after`, oldest first.

        Raises:
            errors.NotFound: no such job.
            errors.BadRequest: `after` < 0, or `limit_bytes` outside 1..LOG_READ_MAX_BYTES.
        """
        if p.after < 0:
            raise errors.BadRequest("after must be >= 0")
        if not 1 <= p.limit_bytes <= LOG_READ_MAX_BYTES:
            raise errors.BadRequest(f"limit_bytes must be 1..{LOG_READ_MAX_BYTES}")
        status, rows, more = await self._read(log_store.read, p.job_id, p.after, p.attempt,
                                              p.limit_bytes)
        if status is None:
            raise errors.NotFound(f"job {p.job_id} not found")
        chunks = [LogChunk(seq=seq, attempt=attempt, token=token, worker_id=worker, stream=stream,
                           pos=pos, data=bytes(data), at=at)
                  for seq, attempt, token, worker, stream, pos, data, at in rows]
        return JobLogs(job_id=p.job_id, status=status, chunks=chunks,
                       next_after=chunks[-1].seq if chunks else p.after, more=more)
