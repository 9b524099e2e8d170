"""The parked calls of one connection (its scope): the RPC layer opens one per connection
and closes it when the peer goes; the parked calls (coordd.service.push) count against it
and end when it closes."""

from __future__ import annotations

import contextvars
from typing import Any


class ParkScope:
    """The parked calls of one connection: counted for its cap, dropped when it closes."""

    def __init__(self) -> None:
        self.parked = 0
        self.closed = False
        self._waiters: set[Any] = set()  # coordd.service.push's waiters (each has `wake()`)

    def close(self) -> None:
        """The peer is gone: wake its parked calls so they end without another look."""
        self.closed = True
        for w in list(self._waiters):
            w.wake()


PARK_SCOPE: contextvars.ContextVar[ParkScope | None] = contextvars.ContextVar(
    "coordd_park_scope", default=None)
