"""Wire Structs of a job's captured model output (`log_append`, `job_logs`). Data only.

Registered in coordd.wire.protocol's PARAMS (kept apart for that module's size). Self-contained,
so either module may be imported first. Same evolution rules: new fields get defaults and
go last; a field's type never changes.
"""

from __future__ import annotations

import msgspec

LOG_STREAMS = ("stdout", "stderr")
LOG_CHUNK_MAX_BYTES = 64 << 10
"""One `log_append` carries at most this many bytes of output."""
LOG_KEEP_BYTES = 1 << 20
"""coordd keeps the newest this many bytes of each stream of each attempt."""
LOG_READ_MAX_BYTES = 4 << 20
"""One `job_logs` reply carries at most this many bytes of output (`limit_bytes`)."""


class LogAppend(msgspec.Struct, kw_only=True):
    """`log_append`: bytes `pos..pos+len(data)` of one stream of the caller's attempt
    (fenced like `checkpoint`). A resend of the same `pos` is stored once."""

    job_id: str
    worker_id: str
    token: int
    stream: str
    pos: int
    data: bytes


class LogAppendResult(msgspec.Struct, kw_only=True):
    """`log_append` result: whether the chunk was new (False: a resend, already stored)."""

    stored: bool


class JobLogsQuery(msgspec.Struct, kw_only=True):
    """`job_logs`: a job's kept output after cursor `after` (a chunk's `seq`), oldest first;
    optionally one attempt's."""

    job_id: str
    after: int = 0
    attempt: int | None = None
    limit_bytes: int = 1 << 20


class LogChunk(msgspec.Struct, kw_only=True):
    """Bytes `pos..pos+len(data)` of `stream` of one attempt (`token` = its lease token)."""

    seq: int
    attempt: int
    token: int
    worker_id: str
    stream: str
    pos: int
    data: bytes
    at: float


class JobLogs(msgspec.Struct, kw_only=True):
    """`job_logs` result. `next_after`: the cursor for the next call; `more`: this reply
    stopped at `limit_bytes` with chunks left; `status`: the job's, so a follower knows
    when the output has ended (terminal, and nothing `more`)."""

    job_id: str
    status: str
    chunks: list[LogChunk]
    next_after: int
    more: bool = False


LOG_PARAMS: dict[str, type[msgspec.Struct]] = {
    "log_append": LogAppend,
    "job_logs": JobLogsQuery,
}
