"""A job's captured output on a PostgreSQL store (StoreCoordinator's mixin): coordd.logs'
checks over the store's log operations (coordd.store.api_logs): `log_append` from the
supervisor's shipper, `job_logs` for `coordctl logs`."""

from __future__ import annotations

import functools
from typing import Any

from coordd.logs import JobLogStore
from coordd.protocol_logs import LOG_PARAMS, JobLogs, JobLogsQuery, LogAppend, LogAppendResult

LOG_METHODS = frozenset(LOG_PARAMS)
"""The job-log RPC methods (coordd.protocol_logs), all served on the store."""


class LogService:
    """`log_append` and `job_logs` over `self.store` (see the module docstring)."""

    store: Any

    @functools.cached_property
    def logs(self) -> JobLogStore:
        """The job logs over this coordinator's store."""
        return JobLogStore(self.store)

    async def log_append(self, p: LogAppend) -> LogAppendResult:
        """Store one chunk of an attempt's output. Raises: BadRequest, PayloadTooLarge,
        and the lease errors (fenced like `checkpoint`)."""
        return await self.logs.log_append(p)

    async def job_logs(self, p: JobLogsQuery) -> JobLogs:
        """A job's kept output after a cursor. Raises: NotFound, BadRequest."""
        return await self.logs.job_logs(p)
