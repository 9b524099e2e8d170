"""The restart grace (config `restart_grace`): run once when coordd starts, before the
reaper or any request, so leases whose holders are alive are not reaped for the time coordd
was down. A coordd outage is a partition of every worker: each one stops its model at its
own local deadline, so the grace keeps a lease only for a worker that renews."""

from __future__ import annotations

import logging

from coordd.store.grace import restart_grace
from coordd.writer import Writer

logger = logging.getLogger(__name__)


async def grant_restart_grace(writer: Writer) -> int:
    """Give every stored lease at least one more `lease_s` from now; return how many."""
    n = await writer.run(restart_grace)
    if n:
        logger.info("restart grace: %d lease(s) run at least one more lease period from now",
                    n, extra={"action": "restart_grace", "n": n})
    return n
