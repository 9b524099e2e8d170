"""One claimed job on a worker, as the supervisor (worker.supervisor) keeps it."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from coordd.wire.protocol import ClaimedJob
from worker.checkpoints import CheckpointRecorder
from worker.config import KindConfig
from worker.logs import LogShipper
from worker.process import ModelProcess

logger = logging.getLogger("worker.supervisor")

class SendStamp:
    """The monotonic time a request frame was written: a lease runs from there
    (docs/reference/protocol.md); pass it as the client's `on_sent`, which re-stamps it."""

    def __init__(self, clock: Any) -> None:
        self._clock = clock
        self.at: float = clock.mono()

    def __call__(self) -> None:
        self.at = self._clock.mono()


CANCELLED = "cancelled"
"""The abort reason of a job whose cancel coordd asked for."""
SHUTDOWN, TIMEOUT, LEASE_LOST = "shutdown", "timeout", "lease_lost"
"""The abort reasons of the worker's stop, of a run past its timeout, of a lost lease."""


@dataclass(eq=False)
class JobRun:
    """One claimed job on this worker: its lease as we time it, its process and its folder."""

    job: ClaimedJob
    token: int
    deadline: float
    """Monotonic time the lease ends, as far as we can know (send time + granted lease_s)."""
    dir: str
    kind: KindConfig | None
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    abort_reason: str | None = None
    lease_gone: bool = False
    proc: ModelProcess | None = None
    waiting_for_slot: bool = False
    holds_slot: bool = False  # a slot of its kind (worker.slots)
    checkpoints: CheckpointRecorder | None = None
    logs: LogShipper | None = None
    group_record: str | None = None  # worker.orphans: the model's group, while it lives
    files: Any = None  # worker.remote_files.RemoteFiles for a coordd on another host
    stop_fate: str | None = None  # what the worker's stop line said of it (worker.stopping)

    @property
    def job_id(self) -> str:
        return self.job.job_id

    def abort(self, reason: str) -> None:
        """Ask the job to end for `reason` (the first reason wins; lease loss is kept apart)."""
        if self.abort_reason is None:
            self.abort_reason = reason
        self.aborted.set()

    def request_cancel(self) -> None:
        """coordd says a cancel was requested (from a renew or a heartbeat): end the job once."""
        if not self.aborted.is_set():
            logger.info("job %s: cancel requested", self.job_id,
                        extra={"action": "cancel", "job_id": self.job_id})
            self.abort(CANCELLED)

    def holds_lease(self, mono: float) -> bool:
        """True while we may still speak for this job."""
        return not self.lease_gone and mono < self.deadline
