"""Lease renewal of one job the worker holds: the supervisor's deadline is the monotonic
moment a claim/renew was *sent* plus the granted `lease_s` (docs/reference/protocol.md),
so a frozen or partitioned worker finds out on its own that its lease is gone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from coordd import errors
from coordd.client import Client
from coordd.clock import Clock
from worker import governance
from worker.config import WorkerConfig
from worker.jobrun import JobRun, SendStamp
from worker.reports import LEASE_GONE, RETRY_S

logger = logging.getLogger(__name__)

RENEW_CALL_TIMEOUT_MAX_S = 5.0


async def renew_loop(client: Client, run: JobRun, worker_id: str, config: WorkerConfig,
                     clock: Clock, lose: Callable[[JobRun, str], None]) -> None:
    """Renew `run`'s lease every third of `config.lease_s` until `run.finished`; act on
    the replies' cancel and governance action. A renew that fails transiently is retried
    (RETRY_S) until the local deadline less `stop_margin_s`; then, or on a refusal that
    says the lease is gone, `lose(run, why)` (it kills the tree) and return."""
    interval = config.lease_s / 3
    while not await clock.wait(run.finished, interval):
        failures = 0
        while True:
            now = clock.mono()
            if now >= (stop_at := run.deadline - config.stop_margin_s):  # gone by then
                lose(run, "local lease deadline passed")
                return
            timeout = min(RENEW_CALL_TIMEOUT_MAX_S, max(0.05, stop_at - now))
            sent = SendStamp(clock)  # re-stamped when the frame is written
            try:
                r = await asyncio.wait_for(client.renew(
                    run.job_id, worker_id, run.token, config.lease_s, on_sent=sent), timeout)
            except LEASE_GONE as exc:
                lose(run, f"{exc.code}: {exc}")
                return
            except (errors.CoordError, TimeoutError) as exc:
                failures += 1
                logger.log(logging.WARNING if failures == 1 else logging.DEBUG,
                           "job %s: renew failed, retrying until the lease ends: %s",
                           run.job_id, exc, extra={"action": "renew_retry", "job_id": run.job_id})
                if await clock.wait(run.finished, max(0.0, min(RETRY_S, stop_at - clock.mono()))):
                    return
                continue
            run.deadline = sent.at + r.lease_s
            if r.cancel_requested:
                run.request_cancel()
            if r.action is not None:
                governance.act(run, r.action.action, r.action.reason, clock.mono())
            break
