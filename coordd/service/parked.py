"""The parked calls themselves (coordd.service.push): one waiter per parked call, woken by
a commit that may concern it, dropped when its connection closes or a newer call of its
worker takes its place; and the index of the parked claims (`ClaimIndex`), so that a
wake-up visits only the claims it concerns."""

from __future__ import annotations

import asyncio
import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Awaitable, Callable, Iterable, Iterator
from itertools import islice
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


def _seq(w: ClaimWaiter) -> int:
    return w.seq


Key = tuple[str | None, str | None]  # (role, kind) a claim may take; None: any


class ClaimIndex:
    """Every parked claim: in arrival order (`all`), by worker (`by_worker`), those looking
    (`looking`: in flight, not asleep), those a fleet-wide limit refused (`limited`), and
    by the (role, kind) they may take, so that a heartbeat visits only its worker's claims
    and a job only the claims that may take it.

    A claim is filed under (role, kind) for each role of its worker (None while unknown:
    any role) and each kind it names (None: any kind); the four buckets of a job's
    (role, kind) are disjoint and each is kept sorted by arrival. `visits` counts the
    claims visited (a deterministic cost figure for tests and benches)."""

    def __init__(self) -> None:
        self.all: dict[int, ClaimWaiter] = {}
        self.by_worker: dict[str, dict[int, ClaimWaiter]] = {}
        self.looking: dict[int, ClaimWaiter] = {}
        self.limited: dict[int, ClaimWaiter] = {}
        self._buckets: dict[Key, list[ClaimWaiter]] = {}
        self._keys: dict[int, list[Key]] = {}  # seq -> the buckets it is filed in
        self.visits = 0

    def add(self, w: ClaimWaiter, roles: frozenset[str] | None) -> None:
        """File `w` (looking), its worker's roles `roles` (None: unknown)."""
        self.all[w.seq] = w
        self.by_worker.setdefault(w.worker_id, {})[w.seq] = w
        self.looking[w.seq] = w
        self._file(w, roles)

    def remove(self, w: ClaimWaiter) -> None:
        """Take `w` out of every part of the index."""
        del self.all[w.seq]
        mine = self.by_worker[w.worker_id]
        del mine[w.seq]
        if not mine:
            del self.by_worker[w.worker_id]
        self.looking.pop(w.seq, None)
        self.limited.pop(w.seq, None)
        self._unfile(w)

    def set_roles(self, worker_id: str, roles: frozenset[str] | None) -> None:
        """The roles of `worker_id` changed (None: unknown): file its claims afresh."""
        for w in self.by_worker.get(worker_id, {}).values():
            self._unfile(w)
            self._file(w, roles)

    def set_idle(self, w: ClaimWaiter, idle: bool) -> None:
        """`w` parks (True) or looks (False)."""
        w.idle = idle
        if idle:
            self.looking.pop(w.seq, None)
        else:
            self.looking[w.seq] = w

    def set_limited(self, w: ClaimWaiter, limited: bool) -> None:
        """`w`'s last look met (True) or did not meet a fleet-wide limit."""
        w.limited = limited
        if limited:
            self.limited[w.seq] = w
        else:
            self.limited.pop(w.seq, None)

    def takers(self, role: str, kind: str, after: int = -1) -> Iterator[ClaimWaiter]:
        """The claims filed for a job of `role`/`kind`, arrived after `after`, oldest
        first (looking or parked); lazily, so a caller that stops early visits no more."""
        runs: list[Iterable[ClaimWaiter]] = []
        for key in ((role, kind), (role, None), (None, kind), (None, None)):
            b = self._buckets.get(key)
            if b:
                runs.append(islice(b, bisect_right(b, after, key=_seq), None))
        if not runs:
            return
        for w in runs[0] if len(runs) == 1 else heapq.merge(*runs, key=_seq):
            self.visits += 1
            yield w

    def _file(self, w: ClaimWaiter, roles: frozenset[str] | None) -> None:
        keys: list[Key] = [(r, k) for r in (roles if roles is not None else (None,))
                           for k in (w.kinds if w.kinds is not None else (None,))]
        for key in keys:
            insort(self._buckets.setdefault(key, []), w, key=_seq)
        self._keys[w.seq] = keys

    def _unfile(self, w: ClaimWaiter) -> None:
        for key in self._keys.pop(w.seq, ()):
            b = self._buckets[key]
            del b[bisect_left(b, w.seq, key=_seq)]
            if not b:
                del self._buckets[key]


ClaimAttempt = Callable[[float], Awaitable[Any]]  # waited_s -> a ClaimResult

__all__ = ["ClaimAttempt", "ClaimIndex", "ClaimWaiter", "Waiter"]
