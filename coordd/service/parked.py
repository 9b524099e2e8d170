"""The parked calls themselves (coordd.service.push): one waiter per parked call, woken by
a commit that may concern it, dropped when its connection closes or a newer call of its
worker takes its place."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from coordd.net.parking import ParkScope


class Waiter:
    """One parked call: woken by `wake()`; `dirty` = something happened while it looked;
    `superseded` = a newer call of the same worker took its place (it ends at once)."""

    __slots__ = ("event", "dirty", "scope", "superseded")

    def __init__(self, scope: ParkScope | None) -> None:
        self.event = asyncio.Event()
        self.dirty = False
        self.scope = scope
        self.superseded = False

    def wake(self) -> None:
        self.dirty = True
        self.event.set()

    @property
    def dropped(self) -> bool:
        return self.superseded or (self.scope is not None and self.scope.closed)


class ClaimWaiter(Waiter):
    """A parked claim: `seq` its arrival order, `kinds` the kinds it names (None: any)."""

    __slots__ = ("seq", "worker_id", "kinds", "idle", "credits", "gated", "limited")

    def __init__(self, scope: ParkScope | None, seq: int, worker_id: str,
                 kinds: frozenset[str] | None) -> None:
        super().__init__(scope)
        self.seq = seq
        self.worker_id = worker_id
        self.kinds = kinds
        self.idle = False                         # parked (True) or looking (False)
        self.credits: list[tuple[str, str]] = []  # (role, kind) of jobs it was woken for
        self.gated = False  # its last look met refusals a heartbeat may lift (gates, stale)
        self.limited = False  # its last look met a fleet-wide limit (units freeing lift it)


ClaimAttempt = Callable[[float], Awaitable[Any]]  # waited_s -> a ClaimResult

__all__ = ["ClaimAttempt", "ClaimWaiter", "Waiter"]
