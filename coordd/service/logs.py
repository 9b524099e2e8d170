"""A job's captured model output: the supervisor ships each attempt's stdout and stderr in
chunks (`log_append`, fenced like `checkpoint`), `coordctl logs` reads them (`job_logs`).

Bounded where it is stored (coordd.store.logs: the tail of each stream of each attempt,
the newest attempts of a job), and pruned with its job. Validation happens here, before a
store is called (coordd.store.api_logs: SQLite's single writer, PostgreSQL).
"""

from __future__ import annotations

import logging

from coordd import errors
from coordd.wire.protocol import ATTEMPTS_MAX
from coordd.wire.logs import (
    LOG_CHUNK_MAX_BYTES, LOG_READ_MAX_BYTES, LOG_STREAMS, JobLogs, JobLogsQuery, LogAppend,
    LogAppendResult,
)
from coordd.rules.names import check_id
from coordd.service.checks import lease_ref
from coordd.store.api_logs import LogStore

logger = logging.getLogger(__name__)

POS_MAX = 1 << 62  # byte offsets beyond this are refused (SQLite integers are signed 64-bit)


class JobLogStore:
    """`log_append` and `job_logs` over a store's log operations (coordd.store.api_logs)."""

    def __init__(self, st: LogStore) -> None:
        self._store = st

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
        return LogAppendResult(stored=await self._store.log_append(
            lease_ref(p), p.stream, p.pos, p.data))

    async def job_logs(self, p: JobLogsQuery) -> JobLogs:
        """A job's kept output after cursor `after`, oldest first.

        Raises:
            errors.NotFound: no such job.
            errors.BadRequest: `after` outside 0..POS_MAX, `attempt` outside
                0..ATTEMPTS_MAX, or `limit_bytes` outside 1..LOG_READ_MAX_BYTES.
        """
        if not 0 <= p.after <= POS_MAX:
            raise errors.BadRequest(f"after must be 0..{POS_MAX}, got {p.after}")
        if p.attempt is not None and not 0 <= p.attempt <= ATTEMPTS_MAX:
            raise errors.BadRequest(f"attempt must be 0..{ATTEMPTS_MAX}, got {p.attempt}")
        if not 1 <= p.limit_bytes <= LOG_READ_MAX_BYTES:
            raise errors.BadRequest(f"limit_bytes must be 1..{LOG_READ_MAX_BYTES}")
        check_id("job_id", p.job_id)
        return await self._store.job_logs(p.job_id, p.after, p.attempt, p.limit_bytes)
