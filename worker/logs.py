"""Ship a model's stdout and stderr to coordd while it runs and at its end (`log_append`),
so `coordctl logs JOB` reads them after the job folder is gone, from any machine.

Each stream is sent in order as chunks of at most LOG_CHUNK_MAX_BYTES, from the position
coordd last acknowledged; an unacknowledged chunk is resent as it was (coordd stores a
resend once). When a stream has more unsent bytes than coordd keeps per stream
(coordd.wire.logs.LOG_KEEP_BYTES), the older part is skipped: coordd would drop it anyway,
and `coordctl logs` shows the gap. Shipping never holds a job up: failures are logged on
a change of state and retried at the next interval.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field

from coordd import errors
from coordd.client import CallTimeout, Client, Disconnected
from coordd.clock import Clock
from coordd.wire.logs import LOG_CHUNK_MAX_BYTES, LOG_KEEP_BYTES as KEEP_BYTES, LOG_STREAMS

logger = logging.getLogger(__name__)

SHIP_INTERVAL_S = 2.0
CHUNKS_PER_SHIP = 4  # per stream and interval: a chatty model is shipped by its tail
CALL_TIMEOUT_S = 5.0
TRANSIENT = (Disconnected, CallTimeout, errors.Overloaded, TimeoutError)
GONE = (errors.LeaseLost, errors.LeaseExpired, errors.NotFound, errors.AlreadyCompleted)


@dataclass
class _Stream:
    name: str
    path: str
    sent: int = 0  # bytes before this are stored in coordd (or skipped)
    pending: tuple[int, bytes] | None = None  # sent, reply not seen: resent as is


def _read(path: str, pos: int, size: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(pos)
        return fh.read(size)


@dataclass(eq=False)
class LogShipper:
    """The output files of one attempt and how far each is shipped.

    Args:
        client: the worker's coordd client.
        worker_id, job_id, token: the attempt's lease (log_append is fenced).
        paths: stream name ("stdout", "stderr") -> the file the model writes it to.
    """

    client: Client
    worker_id: str
    job_id: str
    token: int
    paths: dict[str, str]
    streams: list[_Stream] = field(init=False)
    stopped: bool = False
    _failing: bool = False

    def __post_init__(self) -> None:
        self.streams = [_Stream(n, self.paths[n]) for n in LOG_STREAMS if n in self.paths]

    async def run(self, clock: Clock, stop: asyncio.Event) -> None:
        """Ship every SHIP_INTERVAL_S until `stop` is set (or the lease is gone)."""
        while not self.stopped and not await clock.wait(stop, SHIP_INTERVAL_S):
            await self.ship(CHUNKS_PER_SHIP)

    async def finish(self, timeout_s: float) -> None:
        """Ship everything left (the attempt has ended), giving up after `timeout_s`."""
        try:
            await asyncio.wait_for(self.ship(), timeout_s)
        except TimeoutError:
            logger.warning("job %s: the end of its output was not shipped in time", self.job_id,
                           extra={"action": "log_ship_timeout", "job_id": self.job_id})

    async def ship(self, max_chunks: int | None = None) -> None:
        """Send what is new in each stream (up to `max_chunks` chunks each; None: all)."""
        for st in self.streams:
            n = 0
            while not self.stopped and (max_chunks is None or n < max_chunks):
                chunk = await self._next(st)
                if chunk is None or not await self._send(st, *chunk):
                    break
                n += 1

    async def _next(self, st: _Stream) -> tuple[int, bytes] | None:
        if st.pending is not None:
            return st.pending
        try:
            size = os.stat(st.path).st_size
        except OSError:
            return None
        if size <= st.sent:
            return None
        if size - st.sent > KEEP_BYTES:
            st.sent = size - KEEP_BYTES  # coordd keeps only the tail: skip to it
        try:
            data = await asyncio.to_thread(_read, st.path, st.sent, LOG_CHUNK_MAX_BYTES)
        except OSError:
            return None
        if not data:
            return None
        st.pending = (st.sent, data)
        return st.pending

    async def _send(self, st: _Stream, pos: int, data: bytes) -> bool:
        try:
            await asyncio.wait_for(self.client.log_append(
                self.job_id, self.worker_id, self.token, st.name, pos, data), CALL_TIMEOUT_S)
        except GONE:
            self.stopped = True  # the lease is over: nothing more is ours to send
            return False
        except TRANSIENT as exc:
            self._note(f"output of job {self.job_id} not shipped (will retry): {exc}")
            return False
        except errors.CoordError as exc:
            logger.warning("job %s: output refused by coordd, not shipped: %s", self.job_id, exc,
                           extra={"action": "log_refused", "job_id": self.job_id})
            self.stopped = True
            return False
        st.pending = None
        st.sent = pos + len(data)
        if self._failing:
            self._failing = False
            logger.info("job %s: output shipped again", self.job_id,
                        extra={"action": "log_ship_ok", "job_id": self.job_id})
        return True

    def _note(self, message: str) -> None:
        if not self._failing:
            logger.warning(message, extra={"action": "log_ship_retry", "job_id": self.job_id})
        self._failing = True
