"""Parked calls: long-poll claims, `wait_job`, `watch_worker`, `watch_events`, and the
wake-ups that answer them (issue 15).

The rule not to break: a wake-up is issued only after the COMMIT that makes its change
visible, and never lost. The store notes what may wake a parked call inside the
transaction and calls `committed()` after each COMMIT (or `rolled_back()`), and only then
are waiters woken (coordd.service.push_notes; SQLite: coordd.store.sqlite.wakeups). Every
parked call registers before it looks (claim attempt, job read, feed read), so a commit
that lands while it looks marks it and it looks again instead of sleeping past it. A
spurious wake-up (a rolled back savepoint's note, a job someone else took) costs one more
look, never a wrong answer. Nothing here runs inside a transaction or holds one while
parked.

Claims: a job entering `waiting` gives one wake credit, in arrival order, to the first
idle parked claim whose worker may hold its role and kind; a woken claim that finds
nothing although something was refused (gates, roles) passes its credit on to the next
one; a claim in flight is marked to look again. A `run_at` in the future goes on the
run_at timer (coordd.service.run_at). A worker's new claim supersedes its older parked
ones (a worker claims again at once when a slot frees while its claim names only its other
kinds): they answer with nothing, without another look, or with the job a look under way
takes. A parked claim is filed under its worker's roles as its last stored heartbeat
gave them (`roles_of`; unknown: any job wakes it, until a heartbeat, quiet or stored,
says them). A heartbeat wakes that worker's parked claims when their last answer was a
gate or staleness refusal, or when its roles changed. Units of a fleet-wide limit that
free (a lease ends) or a limit changed at runtime wake the parked claims whose last
answer was a limit refusal; one refused by a rate looks again when its next slot frees
(`next_slot_s` of its answer). Each of these visits only the claims it concerns
(coordd.service.parked.ClaimIndex): a heartbeat its worker's, a job the claims in flight
and the oldest idle ones that may take it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from coordd import errors
from coordd.clock import Clock
from coordd.net.parking import PARK_SCOPE, ParkScope  # noqa: F401 (re-exported)
from coordd.rules.gates import NO_MATCHING_ROLE
from coordd.rules.limits import LIMIT_REFUSED
from coordd.service.parked import ClaimAttempt, ClaimIndex, ClaimWaiter, Waiter
from coordd.service.push_notes import Note, NoteIntake
from coordd.service.run_at import DUE_SLACK_S, RunAtTimer, Scheduled
from coordd.store.api_waits import WaitReads

PARK_PER_CONNECTION_DEFAULT = 16
PARK_TOTAL_DEFAULT = 10_000
PARK_WAIT_MAX_S_DEFAULT = 300.0


class Push(NoteIntake):
    """Parked calls and their wake-ups.

    Args:
        clock: coordd's clock (waits and the run_at timer run on it).
        store: the store (`claims_parked`: told when the first claim parks and the last
            one leaves).
        per_connection_max / total_max: parked calls allowed per connection / in all;
            one more is refused with `overloaded`.
        wait_max_s: the longest any call may stay parked (longer asks are cut to it).

    `roles_of(worker_id)`, set by the Coordinator (coordd.service.beats.Beats.roles_of):
    the roles of the worker's last stored heartbeat, or None (unknown); a new parked claim
    is filed under them, so that a job of another role wakes none.
    """

    def __init__(self, clock: Clock, store: WaitReads, *,
                 per_connection_max: int = PARK_PER_CONNECTION_DEFAULT,
                 total_max: int = PARK_TOTAL_DEFAULT,
                 wait_max_s: float = PARK_WAIT_MAX_S_DEFAULT) -> None:
        self._clock = clock
        self._store = store
        self.per_connection_max = per_connection_max
        self.total_max = total_max
        self.wait_max_s = wait_max_s
        self.parked = 0    # parked calls (looking or asleep)
        self.sleeping = 0  # of them, asleep until a wake-up or their deadline
        self.closing = False
        self._closed = asyncio.Event()
        self._notes: list[Note] = []
        self._seq = itertools.count()
        self._index = ClaimIndex()  # the parked claims
        self._claims = self._index.all  # every parked claim, in arrival order
        self._jobs: dict[str, set[Waiter]] = {}     # wait_job, by job id
        self._workers: dict[str, set[Waiter]] = {}  # watch_worker, by worker id
        self._events: set[Waiter] = set()           # watch_events
        # worker id -> its roles, for the workers with a parked claim (absent: unknown)
        self.roles: dict[str, frozenset[str]] = {}
        self.roles_of: Callable[[str], frozenset[str] | None] = lambda _w: None  # unknown
        self._timer = RunAtTimer(clock, self.job_ready)
        self._events_moved: Callable[[], bool] | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self, scheduled: Scheduled, events_moved: Callable[[], bool] | None = None
              ) -> None:
        """Called by a store that notes its commits in process (SQLite, once its writer is
        open): start the run_at timer with `scheduled(now)` (the (run_at, role, kind) of
        the waiting jobs not yet due; asked again after a clock step); `events_moved()`
        says after a commit whether job events were committed since it was last asked
        (then every `watch_events` call looks)."""
        self._events_moved = events_moved
        self._timer.start(scheduled)

    def clock_stepped(self, step_s: float) -> None:
        """The store moved its stored times by a wall-clock step (SQLite's writer): the
        run_at timer takes the due times afresh and its wait from the new clock. Never
        raises."""
        self._timer.clock_stepped(step_s)

    async def close(self) -> None:
        """Answer every parked call now (each returns its 'nothing yet' reply) and refuse
        new ones with `overloaded`; stop the timer. Idempotent."""
        self.closing = True
        self._closed.set()
        for w in self._all_waiters():
            w.wake()
        await self._timer.close()

    def _all_waiters(self) -> Iterator[Waiter]:
        yield from list(self._claims.values())
        for group in (*self._jobs.values(), *self._workers.values(), self._events):
            yield from list(group)

    # ------------------------------------------------------------ caps

    @contextlib.contextmanager
    def _slot(self, w: Waiter) -> Iterator[None]:
        """Count `w` against the caps for as long as the block runs.

        Raises:
            errors.Overloaded: shutting down, or a cap is reached.
        """
        if self.closing:
            raise errors.Overloaded("coordd is shutting down")
        scope = w.scope
        if self.parked >= self.total_max:
            raise errors.Overloaded(f"too many parked calls ({self.total_max} in all)")
        if scope is not None and scope.parked >= self.per_connection_max:
            raise errors.Overloaded(
                f"too many parked calls on this connection ({self.per_connection_max})")
        self.parked += 1
        if scope is not None:
            scope.parked += 1
            scope._waiters.add(w)
        try:
            yield
        finally:
            self.parked -= 1
            if scope is not None:
                scope.parked -= 1
                scope._waiters.discard(w)

    def wait_s(self, asked: float, what: str = "wait_s") -> float:
        """`asked` seconds cut to [0, wait_max_s].

        Raises:
            errors.BadRequest: NaN or negative.
        """
        if not asked >= 0:  # NaN, negative
            raise errors.BadRequest(f"{what} must be a number of seconds >= 0, got {asked!r}")
        return min(float(asked), self.wait_max_s)

    async def _sleep(self, w: Waiter, deadline: float) -> bool:
        """Park `w` until woken or the monotonic `deadline`; False once the time is up."""
        left = deadline - self._clock.mono()
        if left <= 0 or w.dropped or self.closing:
            return False
        w.event.clear()
        if w.dirty:
            return True
        self.sleeping += 1
        try:
            await self._clock.wait(w.event, left)
        finally:
            self.sleeping -= 1
        return w.event.is_set()

    # ------------------------------------------------------------ claims

    def job_ready(self, role: str, kind: str, n: int = 1) -> None:
        """`n` jobs of `role`/`kind` may be claimable now: one credit each to the first idle
        parked claims that may take them; every claim in flight that may take one looks
        again. Visits the claims in flight and, oldest first, those that may take them
        until the credits are given."""
        index = self._index
        for w in index.looking.values():
            index.visits += 1
            if self._may_take(w, role, kind):
                w.dirty = True
        self._give(role, kind, n, -1)

    def _forward(self, credits: list[tuple[str, str]], after: int) -> None:
        """Pass credits a claim could not use on to the next idle parked claims after it."""
        for role, kind in credits:
            self._give(role, kind, 1, after)

    def _give(self, role: str, kind: str, n: int, after: int) -> None:
        """One credit each to the `n` oldest idle parked claims without one that arrived
        after `after` and may take a job of `role`/`kind`."""
        if n <= 0:
            return
        for w in self._index.takers(role, kind, after):
            if w.idle and not w.credits:
                w.credits.append((role, kind))
                w.wake()
                n -= 1
                if n == 0:
                    return

    def _may_take(self, w: ClaimWaiter, role: str, kind: str) -> bool:
        if w.kinds is not None and kind not in w.kinds:
            return False
        roles = self.roles.get(w.worker_id)
        return roles is None or role in roles

    def _set_roles(self, worker_id: str, roles: frozenset[str] | None) -> None:
        """Note `worker_id`'s roles (None: unknown, any job may wake its claims)."""
        if roles is None:
            self.roles.pop(worker_id, None)
        else:
            self.roles[worker_id] = roles
        self._index.set_roles(worker_id, roles)

    def heartbeat(self, worker_id: str, roles: frozenset[str]) -> None:
        """A heartbeat from `worker_id` was committed (a trigger noted it while claims are
        parked): its gates may have opened, or its roles changed: its parked claims that
        were refused look again. Visits only that worker's claims (none parked: nothing)."""
        mine = self._index.by_worker.get(worker_id)
        if not mine:
            return  # its next claim takes its roles from `roles_of`
        if self.roles.get(worker_id) == roles:
            for w in mine.values():
                self._index.visits += 1
                if w.gated:
                    w.wake()
            return
        self._set_roles(worker_id, roles)
        for w in mine.values():
            self._index.visits += 1
            w.wake()

    def beat_roles(self, worker_id: str, roles: list[str]) -> None:
        """A quiet heartbeat (answered from memory, nothing stored: coordd.service.beats)
        says `worker_id` still has the `roles` of its last stored beat: its parked claims
        are filed under them if they were not (unknown: none looks; other roles: they look
        again, as at a stored change). Gates did not move: a gated claim stays asleep."""
        mine = self._index.by_worker.get(worker_id)
        if not mine:
            return
        known, now = self.roles.get(worker_id), frozenset(roles)
        if known == now:
            return
        self._set_roles(worker_id, now)
        if known is not None:
            for w in mine.values():
                self._index.visits += 1
                w.wake()

    def limits_changed(self) -> None:
        """Units of a fleet-wide limit freed, or a limit changed: the parked claims a
        limit refused look again (only they are visited)."""
        for w in self._index.limited.values():
            self._index.visits += 1
            w.wake()

    def wake_claims(self) -> None:
        """Every parked claim looks again (a store whose wake-ups do not say which role
        and kind may have come free: PostgreSQL's NOTIFY and poll)."""
        for w in self._claims.values():
            w.wake()

    async def claim(self, worker_id: str, kinds: list[str] | None, wait_s: float,
                    attempt: ClaimAttempt) -> Any:
        """Claim for up to `wait_s` seconds: `attempt(waited_s)` until it hands out a job,
        parked between attempts until a job this worker may take may have become
        claimable. Returns the last attempt's result (a job, or none at the deadline, at
        shutdown, or when the connection closed). A look that finds nothing but met
        refusals (`reasons`: gates, roles, staleness) passes its credit on.

        Raises:
            errors.Overloaded: a cap on parked calls is reached (nothing was claimed).
        """
        w = ClaimWaiter(PARK_SCOPE.get(), next(self._seq), worker_id,
                        None if kinds is None else frozenset(kinds))
        # its roles as its last stored heartbeat gave them (None: unknown, any job may wake
        # it, until a heartbeat says them); later stored changes come as `heartbeat`
        roles = self.roles_of(worker_id)
        self._set_roles(worker_id, roles)
        start = self._clock.mono()
        deadline = start + wait_s
        for old in self._index.by_worker.get(worker_id, {}).values():
            old.superseded = True
            old.wake()
        with self._slot(w):
            if not self._claims:
                self._store.claims_parked(True)
            self._index.add(w, roles)
            try:
                while True:
                    w.dirty = False
                    used, w.credits = w.credits, []
                    res = await attempt(self._clock.mono() - start)
                    if getattr(res, "job", None) is not None:
                        return res
                    reasons = getattr(res, "reasons", None) or ()
                    w.gated = any(r != NO_MATCHING_ROLE for r in reasons)
                    self._index.set_limited(w, LIMIT_REFUSED in reasons)
                    slot = getattr(res, "next_slot_s", None)  # a rate frees a unit then
                    if used and reasons:
                        self._forward(used, w.seq)
                    if w.dropped or self.closing:
                        return res
                    if w.dirty or w.credits:
                        continue
                    self._index.set_idle(w, True)
                    until = deadline if slot is None else \
                        min(deadline, self._clock.mono() + slot + DUE_SLACK_S)
                    try:
                        woken = await self._sleep(w, until)
                    finally:
                        self._index.set_idle(w, False)
                    if not woken and until < deadline and not (w.dropped or self.closing):
                        continue  # a rate slot came free: look again
                    if not woken or w.dropped or self.closing:
                        if hasattr(res, "waited_s"):  # the whole wait, not the last look's
                            res.waited_s = self._clock.mono() - start
                        return res
            finally:
                self._index.remove(w)
                if worker_id not in self._index.by_worker:
                    self.roles.pop(worker_id, None)  # asked afresh at its next claim
                if not self._claims:
                    self._store.claims_parked(False)
                if w.credits:  # woken, then left without looking (dropped, shutdown)
                    self._forward(w.credits, w.seq)

    # ------------------------------------------------------------ other parked calls

    async def wait_for(self, group: str, key: str | None, wait_s: float,
                       look: Callable[[], Awaitable[tuple[Any, ...]]]) -> Any:
        """Run `look()` -> (done, value) until done, parked between looks until a commit
        concerns `key` in `group` ("job": a terminal status; "worker": a cancel for its
        jobs; "events": any job event), or `wait_s` passes. Returns the last value. A
        worker's new watch supersedes its older parked ones (a worker re-parks its watch
        when a job it was told about starts again): they answer at once, without a look.
        look may return (done, value, again_s): not done, look again after `again_s`
        even without a wake-up (None: only on one).

        Raises:
            errors.Overloaded: a cap on parked calls is reached.
        """
        w = Waiter(PARK_SCOPE.get())
        deadline = self._clock.mono() + wait_s
        if group == "events":
            registry: set[Waiter] = self._events
        else:
            table = self._jobs if group == "job" else self._workers
            assert key is not None
        if group == "worker":
            for old in self._workers.get(key, ()):  # type: ignore[arg-type]
                old.superseded = True
                old.wake()
        with self._slot(w):
            if group != "events":
                registry = table.setdefault(key, set())
            registry.add(w)
            try:
                while True:
                    w.dirty = False
                    done, value, *again = await look()
                    if done or w.dropped or self.closing:
                        return value
                    if w.dirty:
                        continue
                    until = deadline if not again or again[0] is None else \
                        min(deadline, self._clock.mono() + again[0])
                    woken = await self._sleep(w, until)
                    if not woken and until < deadline and not (w.dropped or self.closing):
                        continue  # its own time to look again came
                    if not woken or w.dropped or self.closing:
                        return value
            finally:
                registry.discard(w)
                if group != "events" and not registry:
                    table.pop(key, None)  # type: ignore[arg-type]


__all__ = ["PARK_PER_CONNECTION_DEFAULT", "PARK_SCOPE", "PARK_TOTAL_DEFAULT",
           "PARK_WAIT_MAX_S_DEFAULT", "ClaimAttempt", "ParkScope", "Push"]
