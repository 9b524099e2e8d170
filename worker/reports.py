"""The worker's reports to coordd: `complete`, `fail` and `release` of a job it holds.

The rule not to break: a report is sent only while the lease is held (docs/concepts/leases.md), and
resent on a lost reply or on `unavailable` (coordd's storage refused it) until the lease
ends, so a result the model produced is not lost to a transient error; while the worker
stops, each gets SHUTDOWN_REPORT_TIMEOUT_S at most.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from coordd import errors
from coordd.client import CallTimeout, Client, Disconnected
from coordd.clock import Clock
from worker.jobrun import JobRun

logger = logging.getLogger(__name__)

RETRY_S = 0.2
"""Pause between quick retries of a renew or a report that failed transiently."""
REPORT_TIMEOUT_S = 5.0
REPORT_RETRY_MAX_S = 60.0
SHUTDOWN_REPORT_TIMEOUT_S = 2.0

LEASE_GONE = (errors.LeaseLost, errors.LeaseExpired, errors.NotFound, errors.AlreadyCompleted)


class Reporter:
    """Send one worker's job reports (see the module doc).

    Args:
        client: the supervisor's coordd client.
        worker_id: the worker the leases belong to.
        clock: the supervisor's clock.
        stop: set once the worker stops (reports then get SHUTDOWN_REPORT_TIMEOUT_S).
    """

    def __init__(self, client: Client, worker_id: str, clock: Clock,
                 stop: asyncio.Event, eager: Any = None) -> None:
        self._client, self.worker_id, self._clock, self._stop = client, worker_id, clock, stop
        self._never = asyncio.Event()
        self._eager = eager  # worker.claiming.ClaimLoop: each report's next claim, or None

    async def send(self, run: JobRun, method: str, **params: Any) -> Any:
        """Send `method` (complete, fail, release) while we hold the lease; resend on a
        lost reply, and on `unavailable` (coordd's storage refused it) until the lease
        ends. With an `eager` claim loop, the report asks for the worker's next job
        (`next`) and the jobs it brings are started. Returns the reply, or None if
        dropped. Raises: errors.AlreadyCompleted, other errors.CoordError refusals."""
        stopping = self._stop.is_set()
        timeout = SHUTDOWN_REPORT_TIMEOUT_S if stopping else REPORT_TIMEOUT_S
        give_up = self._clock.mono() + (timeout if stopping else REPORT_RETRY_MAX_S)
        call = getattr(self._client, method)
        unavailable = resent = False
        ask = None if self._eager is None else self._eager.next_ask(run)
        if ask is not None:
            params["next"] = ask
        while True:
            if not run.holds_lease(self._clock.mono()):
                logger.warning("job %s: lease gone, %s not sent", run.job_id, method,
                               extra={"action": "report_dropped", "job_id": run.job_id})
                return None
            try:
                sent = self._clock.mono()
                res = await asyncio.wait_for(
                    call(run.job_id, self.worker_id, run.token, **params), timeout)
                run.finished.set()  # the lease ends with this report: stop renewing it
                if ask is not None:
                    await self._eager.take_next(run, ask, res.next, sent, replay=False)
                return res
            except errors.AlreadyCompleted:
                run.finished.set()
                if ask is not None and resent:  # stored by the lost one: its next claim too
                    await self._eager.take_next(run, ask, None, 0.0, replay=True)
                raise
            except LEASE_GONE as exc:
                run.lease_gone = True
                if ask is not None and resent:
                    await self._eager.take_next(run, ask, None, 0.0, replay=True)
                logger.warning("job %s: %s refused: %s", run.job_id, method, exc,
                               extra={"action": "report_refused", "job_id": run.job_id})
                return None
            except errors.Unavailable as exc:  # coordd's disk is full: retry while we hold
                resent = True  # (PostgreSQL: a connection lost at the commit may have stored it)
                if not unavailable:            # the lease (a stored result must not be lost)
                    logger.warning("job %s: %s not stored yet, retrying until the lease "
                                   "ends: %s", run.job_id, method, exc,
                                   extra={"action": "report_retry", "job_id": run.job_id})
                unavailable = True
                if stopping and self._clock.mono() >= give_up:
                    return None
                await self._clock.wait(self._never, RETRY_S)
            except (Disconnected, CallTimeout, errors.Overloaded, TimeoutError) as exc:
                resent = resent or not isinstance(exc, errors.Overloaded)  # may be stored
                if self._clock.mono() >= give_up:
                    logger.warning("job %s: %s not delivered: %s", run.job_id, method, exc,
                                   extra={"action": "report_lost", "job_id": run.job_id})
                    return None
                await self._clock.wait(self._never, RETRY_S)

    async def release(self, run: JobRun, reason: str, routine: bool = False) -> None:
        """Hand the job back without spending its attempt (`fail` on an older coordd).
        `routine` (this worker's stop, a vacate coordd asked for) logs it at INFO, not as a
        warning."""
        try:
            if await self.send(run, "release", reason=reason) is not None:
                logger.log(logging.INFO if routine else logging.WARNING,
                           "job %s: handed back (%s)", run.job_id, reason,
                           extra={"action": "release", "job_id": run.job_id})
        except errors.UnknownMethod:
            await self.fail(run, reason, True)
        except errors.CoordError as exc:
            logger.error("job %s: release refused: %s", run.job_id, exc,
                         extra={"action": "release_refused", "job_id": run.job_id})

    async def fail(self, run: JobRun, error: str, retryable: bool) -> None:
        """Report the job failed (`retryable`: back to waiting while attempts remain)."""
        try:
            res = await self.send(run, "fail", error=error, retryable=retryable)
        except errors.CoordError as exc:
            logger.error("job %s: fail refused: %s", run.job_id, exc,
                         extra={"action": "fail_refused", "job_id": run.job_id})
            return
        if res is not None:
            logger.info("job %s: failed (%s) -> %s", run.job_id, error[:200], res.status,
                        extra={"action": "fail", "job_id": run.job_id, "status": res.status,
                               "retryable": retryable})

    async def complete(self, run: JobRun, outcome: Any,
                       usage: dict[str, float] | None = None) -> None:
        """Report the job's result: `outcome` is (result, artifact ref) of
        worker.artifacts.read_result; a result coordd refuses fails the job for good."""
        result, artifact = outcome
        extra = {"usage": usage} if usage else {}
        try:
            res = await self.send(run, "complete", result=result, artifact=artifact, **extra)
        except errors.AlreadyCompleted:
            logger.info("job %s: result already stored", run.job_id,
                        extra={"action": "complete", "job_id": run.job_id})
            return
        except errors.CoordError as exc:  # e.g. payload_too_large: the job cannot succeed as is
            await self.fail(run, f"result refused by coordd: {exc.code}: {exc}", False)
            return
        if res is not None:  # `error`: coordd refused the result against the kind's schema
            logger.info("job %s: %s%s", run.job_id, res.status,
                        f" (result refused: {res.error})" if res.error else "",
                        extra={"action": "complete", "job_id": run.job_id, "status": res.status})
