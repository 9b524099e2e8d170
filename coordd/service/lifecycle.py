"""A worker's life as coordd sees it: incarnations, the kinds it runs and those broken
on it, and the leases that end when it is gone.

What `heartbeat` checks of a worker's kinds, the log line of leases ended because their
worker is gone (a new incarnation, a goodbye, an admin's `forget_worker --force`: the
Coordinator's methods, coordd.service), and what a waiting job's reason says of kinds.
The rule: a lease is never ended while its holder may still speak for it.
"""

from __future__ import annotations

import logging

from coordd import errors
from coordd.rules.names import check_name, escape
from coordd.wire.protocol import Heartbeat
from coordd.jsontext import dumps

logger = logging.getLogger(__name__)

REASON_MAX_CHARS = 500  # a broken kind's reason, as the worker sent it
KINDS_MAX = 1000


def _clip(text: str, limit: int) -> str:
    text = escape(text)
    return text if len(text) <= limit else text[:limit] + "..."


def heartbeat_state(p: Heartbeat) -> tuple[str | None, str | None]:
    """Check and encode a heartbeat's kinds: (kinds JSON or None, broken kinds JSON or
    None). Raises: errors.BadRequest (a bad kind name, too many kinds)."""
    if p.incarnation is not None:
        check_name("incarnation", p.incarnation)
    if len(p.kinds or ()) + len(p.broken_kinds) > KINDS_MAX:
        raise errors.BadRequest(f"at most {KINDS_MAX} kinds")
    for kind in [*(p.kinds or ()), *p.broken_kinds]:
        check_name("kind", kind)
    kinds = None if p.kinds is None else dumps(sorted(set(p.kinds)))
    broken = {k: _clip(v, REASON_MAX_CHARS) for k, v in sorted(p.broken_kinds.items())}
    return kinds, (dumps(broken) if broken else None)


def log_lost(worker_id: str, lost: list[str], why: str) -> None:
    """Log leases ended because their worker is gone."""
    if lost:
        logger.warning("worker %s %s: %d lease(s) released (worker_lost)", worker_id, why,
                       len(lost), extra={"action": "worker_lost", "worker_id": worker_id,
                                         "jobs": lost})


