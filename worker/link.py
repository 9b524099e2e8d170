"""Whether coordd answers this worker: one log line per change (answering, unreachable,
refusing this worker: coordd.client.Refused, an ERROR that says why), and backoff while
it does not.

Every call that could not reach coordd (Disconnected, CallTimeout) reports here instead
of logging on its own, so a coordd that is down gives one warning, not one per call, and
the loops that poll (claims, checkpoints) space their tries out exponentially.
"""

from __future__ import annotations

import logging

from coordd.client import Closed, Refused
from coordd.transport import REFUSED_BACKOFF_CAP_S

logger = logging.getLogger(__name__)

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 10.0


class Link:
    """The worker's view of its connection to coordd."""

    def __init__(self, base_s: float = BACKOFF_BASE_S, cap_s: float = BACKOFF_CAP_S,
                 refused_cap_s: float = REFUSED_BACKOFF_CAP_S) -> None:
        self.down: str | bool = False  # False, "unreachable" or "refused" (by coordd)
        self.refused_cap_s = refused_cap_s
        self._failures = 0
        self._base_s, self._cap_s = base_s, cap_s

    def failed(self, exc: Exception) -> None:
        """A call did not reach coordd: log the change to down once. A call this worker
        cut short itself (its own client closed, at stop) says nothing about coordd."""
        if isinstance(exc, Closed):
            return
        state = "refused" if isinstance(exc, Refused) else "unreachable"
        if state == "refused" and self.down != state:
            logger.error("%s; this worker dials again with a backoff that doubles up to %g s "
                         "(once the certificate or coordd's tls_deny_* settings are fixed, "
                         "the next try succeeds)", exc, self.refused_cap_s,
                         extra={"action": "coordd_refused"})
        elif state == "unreachable" and self.down != state:
            logger.warning("coordd unreachable: %s (retrying with backoff)", exc,
                           extra={"action": "coordd_down"})
        self.down = state
        self._failures += 1

    def answered(self) -> None:
        """coordd answered a call: log the change to up once."""
        if self.down:
            logger.info("coordd reachable again", extra={"action": "coordd_up"})
        self.down = False
        self._failures = 0

    def delay(self, normal_s: float) -> float:
        """Seconds to wait before the next try of a loop that waits `normal_s` while coordd
        answers: min(cap, base * 2**(failures-1)) while it does not, never less than normal."""
        if not self.down:
            return normal_s
        backoff = self._base_s * 2.0 ** min(self._failures - 1, 30)
        return max(normal_s, min(self._cap_s, backoff))
