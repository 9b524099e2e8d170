"""Several coordd addresses for one client: an active coordd and its standbys (a
PostgreSQL store, docs/guides/postgresql.md). Each connect tries the address that answered
last, then every other in turn; only when none answers does the next connect wait a capped
exponential backoff with full jitter (as coordd.transport's). The client's own reconnect
loop does the rest: a call after a lost connection connects again, here. A connect that
lands on another address than the last one that answered logs a WARNING naming both (the
operator's line for a fail-over).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from coordd.clock import Clock, SystemClock
from coordd.transport import P, ConnectFailed, Connector, Refusals, TlsFiles

T = TypeVar("T")
logger = logging.getLogger(__name__)

BACKOFF_BASE_S = 0.1
BACKOFF_CAP_S = 2.0  # short: a standby that took over should be found within seconds


class Failover:
    """A Connector over several endpoints (the Client takes it as `connector`).

    Args:
        endpoints: socket paths, `tls://HOST:PORT` or `tcp://HOST:PORT` (at least one).
        files: the TLS files for tls:// endpoints.
        connect_timeout_s: one connect to one endpoint must finish within this.
        refusals: the backoff after coordd refused this client (coordd.transport.Refusals;
            one for every endpoint: a standby refuses as the active one does).
    Raises: ValueError (no endpoint, a bad one, tls:// without files).
    """

    def __init__(self, endpoints: Sequence[str], files: TlsFiles | None = None, *,
                 connect_timeout_s: float = 5.0, backoff_base_s: float = BACKOFF_BASE_S,
                 backoff_cap_s: float = BACKOFF_CAP_S, rng: random.Random | None = None,
                 clock: Clock | None = None, refusals: Refusals | None = None) -> None:
        if not endpoints:
            raise ValueError("no coordd address given")
        self.connectors = [Connector(e, files, connect_timeout_s=connect_timeout_s,
                                     backoff_base_s=0.0, backoff_cap_s=0.0) for e in endpoints]
        self._current = 0
        self._base, self._cap = backoff_base_s, backoff_cap_s
        self._rng = rng or random.Random()
        self._clock = clock or SystemClock()
        self.refusals = refusals or Refusals(clock=self._clock)
        self.failures = 0  # rounds in a row in which no endpoint answered
        self._next_try = 0.0

    @property
    def endpoint(self) -> str:
        """The address that answered last (or the first)."""
        return self.connectors[self._current].endpoint

    @property
    def scheme(self) -> str:
        """Its scheme: unix, tls or tcp."""
        return self.connectors[self._current].scheme

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect as `connect` does, as a pair of streams. Raises: ConnectFailed."""
        return await self._first(lambda c: c.open())

    async def connect(self, protocol_factory: Callable[[], P]) -> tuple[asyncio.Transport, P]:
        """Connect to the first endpoint that answers, starting at the last good one,
        served by the protocol `protocol_factory()` makes.

        Raises: ConnectFailed (none answered: every endpoint's reason; `refused`: coordd
        refused this client a moment ago, nothing dialled).
        """
        return await self._first(lambda c: c.connect(protocol_factory))

    async def _first(self, dial: Callable[[Connector], Awaitable[T]]) -> T:
        not_yet = self.refusals.admit()
        if not_yet is not None:
            raise ConnectFailed(not_yet, refused=True)
        wait = self._next_try - self._clock.mono()
        if wait > 0:
            await asyncio.sleep(wait)
        why = []
        n = len(self.connectors)
        for k in range(n):
            i = (self._current + k) % n
            try:
                got = await dial(self.connectors[i])
            except ConnectFailed as exc:
                why.append(exc.message)
                continue
            if i != self._current:  # a fail-over: the one that answered last did not
                logger.warning("coordd at %s: %s; connected to %s",
                               self.connectors[self._current].endpoint, why[0],
                               self.connectors[i].endpoint,
                               extra={"action": "coordd_failover",
                                      "endpoint": self.connectors[i].endpoint})
            self._current, self.failures, self._next_try = i, 0, 0.0
            return got
        self.failures += 1
        self._next_try = self._clock.mono() + self._rng.uniform(
            0.0, min(self._cap, self._base * 2.0 ** min(self.failures - 1, 30)))
        raise ConnectFailed("no coordd answers: " + "; ".join(why))

    def closed_unanswered(self, exc: BaseException | None) -> str | None:
        """As Connector.closed_unanswered, for the endpoint connected last."""
        return self.connectors[self._current].closed_unanswered(exc)
