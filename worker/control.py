"""The worker's control watch: one parked `watch_worker` call while it holds jobs, so a
cancel (and, once coordd decides them, suspend / resume / vacate) reaches the model in
milliseconds. Renew and heartbeat replies carry the same cancel lists: they stay the
fallback, and the only path against an older coordd (unknown_method ends the watch).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from coordd import errors
from coordd.client import Client
from coordd.clock import Clock
from coordd.wire.push import WorkerActions

logger = logging.getLogger(__name__)

T = TypeVar("T")
ACTIONS = ("cancel", "suspend", "resume", "vacate")
EARLY_FRACTION = 0.5  # a watch answered sooner than this part of wait_s with nothing new: pause


def early(elapsed: float, wait_s: float) -> bool:
    """A parked call answered with nothing after `elapsed` s came back early (an older
    coordd that does not park, an error, coordd stopping): the caller should pause."""
    return wait_s <= 0 or elapsed < EARLY_FRACTION * wait_s


async def until(stop: asyncio.Event, call: Awaitable[T], *more: asyncio.Event) -> T | None:
    """Await `call`, or give it up (cancelled) once `stop` (or any of `more`) is set; None
    then.

    A call already answered when `stop` comes still returns its result.
    """
    task = asyncio.ensure_future(call)
    stopped = [asyncio.ensure_future(e.wait()) for e in (stop, *more)]
    try:
        await asyncio.wait({task, *stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for s in stopped:
            s.cancel()
    if not task.done():
        task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        if not task.cancelled():
            raise
        return None


class ControlWatch:
    """Keep a `watch_worker` call parked at coordd while the worker holds jobs.

    Its `client` is a connection of its own, for the parked calls (the worker's claim
    too): closing it (`close()`, first thing at stop) makes coordd drop them, so a parked
    claim cannot take back a job the worker is handing back.

    Args:
        client: a coordd client for the parked calls (not the supervisor's own).
        worker_id: whose jobs.
        config: the worker config: `claim_wait_s` is how long each call stays parked (0 =
            off), `claim_interval_s` the pause after an error or an early empty answer.
        clock: the supervisor's clock.
        held: returns the JobRuns by job id.
        act: `act(job_id, action, reason)` per new action ("cancel" | "suspend" |
            "resume" | "vacate"; reason None for a cancel); default: `request_cancel()` on
            the held run for a cancel, the others ignored.
    """

    def __init__(self, client: Client, worker_id: str, config: Any, clock: Clock,
                 held: Callable[[], dict[str, Any]],
                 act: Callable[[str, str, str | None], None] | None = None) -> None:
        self.client = self._client = client
        self._worker_id = worker_id
        self._wait_s = config.claim_wait_s
        self._interval = config.claim_interval_s
        self._clock = clock
        self._held = held
        self._act = act or self._cancel
        self.holding = asyncio.Event()  # set when the supervisor starts a job (`started`)
        self.served = True  # False once coordd answered unknown_method
        self._seen = WorkerActions()  # what coordd told: `seen` of the next call
        self._sent = WorkerActions()  # `seen` of the call in flight
        self._fresh: set[str] = set()  # jobs started since that call was sent
        self._reask = asyncio.Event()  # the call in flight carries a started job: re-park

    def started(self, job_id: str) -> None:
        """The supervisor holds a new run of `job_id`: what coordd told about an earlier
        lease of that id (a job cancelled, retried and claimed again) no longer counts, so
        it leaves `seen`, and a call parked with it in its `seen` (or the pause after an
        answer that named it before the run was held) ends: the watch asks again at once."""
        self._fresh.add(job_id)
        if any(job_id in getattr(told, a) for told in (self._sent, self._seen) for a in ACTIONS):
            self._seen = WorkerActions(**{a: [j for j in getattr(self._seen, a) if j != job_id]
                                          for a in ACTIONS})
            self._reask.set()  # the parked call (or the pause after it) ends: ask again
        self.holding.set()

    async def close(self) -> None:
        """Close the parked calls' connection (coordd drops what is parked on it)."""
        await self._client.close()

    def _cancel(self, job_id: str, action: str, reason: str | None = None) -> None:
        run = self._held().get(job_id)
        if run is not None and action == "cancel":
            run.request_cancel()

    async def run(self, stop: asyncio.Event) -> None:
        """Watch until `stop` is set."""
        if self._wait_s <= 0:
            return
        while not stop.is_set():
            if not self._held():
                self.holding.clear()
                await until(stop, self.holding.wait())
                self._seen = WorkerActions()
                continue
            asked = self._clock.mono()
            self._sent, self._fresh = self._seen, set()
            self._reask.clear()
            try:
                acts = await until(stop, self._client.watch_worker(
                    self._worker_id, self._wait_s, self._sent), self._reask)
            except errors.UnknownMethod:
                logger.info("coordd has no watch_worker: cancels arrive with renewals",
                            extra={"action": "watch_unsupported"})
                self.served = False
                return
            except errors.CoordError as exc:  # down, overloaded, timed out: ask again soon
                logger.debug("control watch: %s", exc, extra={"action": "watch_error"})
                await self._clock.wait(stop, self._interval)
                continue
            if acts is None:
                continue  # stopped, or re-parked without a job started since (`started`)
            if not self._told(acts) and early(self._clock.mono() - asked, self._wait_s):
                # coordd answered early with nothing new: pace, unless a job starts
                await until(stop, self._clock.wait(self._reask, self._interval))

    def _told(self, acts: WorkerActions) -> bool:
        """Act on what `acts` holds that the call did not know, for held jobs; it all
        becomes the next `seen` (a job not held yet leaves it when it starts). True if
        anything was new."""
        held = self._held()
        new = False
        for action in ACTIONS:
            known = set(getattr(self._sent, action)) - self._fresh
            for job_id in getattr(acts, action):
                if job_id not in known and job_id in held:
                    new = True
                    try:
                        self._act(job_id, action, acts.reasons.get(job_id))
                    except Exception:
                        logger.exception("acting on %s for %s failed", action, job_id,
                                         extra={"action": "watch_act_failed"})
        self._seen = WorkerActions(**{a: [j for j in getattr(acts, a)
                                          if j in held or j not in self._fresh]
                                      for a in ACTIONS})
        return new
