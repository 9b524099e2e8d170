"""Parked calls: long-poll claims, `wait_job`, `watch_worker`, `watch_events`, and the
wake-ups that answer them (issue 15).

The rule not to break: a wake-up is issued only after the COMMIT that makes its change
visible, and never lost. The writer's job hook (coordd.store.sqlite.job_changes: `job_waiting`,
`job_ended`) and TEMP triggers (coordd.store.push) call `note` inside the transaction;
the writer calls `committed()` after each COMMIT (or
`rolled_back()`), and only then are waiters woken (new job events: the highest event id
after the commit says). Every parked call registers before
it looks (claim attempt, job read, feed read), so a commit that lands while it looks
marks it and it looks again instead of sleeping past it. A spurious wake-up (a rolled
back savepoint's note, a job someone else took) costs one more look, never a wrong
answer. Nothing here runs inside a transaction or holds one while parked.

Claims: a job entering `waiting` gives one wake credit, in arrival order, to the first
idle parked claim whose worker may hold its role and kind; a woken claim that finds
nothing although something was refused (gates, roles) passes its credit on to the next
one; a claim in flight is marked to look again. A `run_at` in the future goes on one
timer heap (one task waits for the earliest due job). A worker's new claim supersedes
its older parked ones (a worker claims again at once when a slot frees while its claim
names only its other kinds): they answer with nothing, without another look, or with the
job a look under way takes. A heartbeat wakes that worker's
parked claims when their last answer was a gate or staleness refusal. Units of a
fleet-wide limit that free (a lease ends) or a limit changed at runtime wake the parked
claims whose last answer was a limit refusal; one refused by a rate looks again when its
next slot frees (`next_slot_s` of its answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

from coordd import errors
from coordd.clock import Clock
from coordd.net.parking import PARK_SCOPE, ParkScope  # noqa: F401 (re-exported)
from coordd.rules.gates import NO_MATCHING_ROLE
from coordd.rules.limits import LIMIT_REFUSED
from coordd.store import push as push_store

logger = logging.getLogger(__name__)

PARK_PER_CONNECTION_DEFAULT = 16
PARK_TOTAL_DEFAULT = 10_000
PARK_WAIT_MAX_S_DEFAULT = 300.0
TIMER_IDLE_S = 3600.0  # the run_at timer's wait when no job is scheduled
DUE_SLACK_S = 0.001    # fire a run_at timer this much late, so the claim's `now` has passed it


def _roles(text: Any) -> list[str]:
    try:
        roles = json.loads(text)
    except (TypeError, ValueError):
        return []
    return [r for r in roles if isinstance(r, str)] if isinstance(roles, list) else []


class _Waiter:
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


class _ClaimWaiter(_Waiter):
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


class Push:
    """Parked calls and their wake-ups.

    Args:
        clock: coordd's clock (waits and the run_at timer run on it).
        per_connection_max / total_max: parked calls allowed per connection / in all;
            one more is refused with `overloaded`.
        wait_max_s: the longest any call may stay parked (longer asks are cut to it).
    """

    def __init__(self, clock: Clock, *, per_connection_max: int = PARK_PER_CONNECTION_DEFAULT,
                 total_max: int = PARK_TOTAL_DEFAULT,
                 wait_max_s: float = PARK_WAIT_MAX_S_DEFAULT) -> None:
        self._clock = clock
        self.per_connection_max = per_connection_max
        self.total_max = total_max
        self.wait_max_s = wait_max_s
        self.parked = 0    # parked calls (looking or asleep)
        self.sleeping = 0  # of them, asleep until a wake-up or their deadline
        self.closing = False
        self._closed = asyncio.Event()
        self._notes: list[tuple[str, str, Any, Any, Any]] = []
        self._seq = itertools.count()
        self._claims: dict[int, _ClaimWaiter] = {}  # every parked claim, in arrival order
        self._jobs: dict[str, set[_Waiter]] = {}     # wait_job, by job id
        self._workers: dict[str, set[_Waiter]] = {}  # watch_worker, by worker id
        self._events: set[_Waiter] = set()           # watch_events
        self.roles: dict[str, frozenset[str]] = {}   # worker id -> roles of its last heartbeat
        self._due: list[tuple[float, str, str]] = []  # (run_at, role, kind) heap
        self._timer_kick = asyncio.Event()
        self._timer: asyncio.Task[None] | None = None
        self._db: sqlite3.Connection | None = None  # the writer's connection (attach)
        self._last_event = 0

    def attach(self, conn: sqlite3.Connection) -> None:
        """Install the TEMP triggers on the writer's connection (its `on_open` hook) and
        start the run_at timer with the jobs already scheduled there."""
        push_store.install(conn, self.note)
        self._db = conn
        self._last_event = push_store.last_event(conn)
        self.start(push_store.scheduled(conn, self._clock.wall()))

    def _flag(self, fn: Callable[..., None], *args: Any) -> None:
        """Run a TEMP-table statement on the writer's connection (from the loop: never
        inside its transaction, whose batch runs without yielding)."""
        if self._db is None:
            return
        try:
            fn(self._db, *args)
        except sqlite3.Error as exc:  # closed at shutdown: nothing is parked any more
            logger.debug("push flag: %s", exc)

    # ------------------------------------------------------------ lifecycle

    def clock_stepped(self, step_s: float) -> None:
        """The writer moved the stored times by a wall-clock step (its `on_clock_step`
        hook): the run_at timer takes the due times afresh from the database and its
        wait from the new clock. Never raises."""
        try:
            if self._db is not None:
                self._due = push_store.scheduled(self._db, self._clock.wall())
                heapq.heapify(self._due)
            self._timer_kick.set()
        except Exception:  # waiters time out instead; the writer must not fail
            logger.exception("run_at timer after a clock step of %+.1fs", step_s,
                             extra={"action": "push_failed"})

    def start(self, scheduled: list[tuple[float, str, str]]) -> None:
        """Start the run_at timer with the jobs already scheduled in the database."""
        self._due = list(scheduled)
        heapq.heapify(self._due)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().create_task(self._run_timer(),
                                                                 name="coordd-push-timer")

    async def close(self) -> None:
        """Answer every parked call now (each returns its 'nothing yet' reply) and refuse
        new ones with `overloaded`; stop the timer. Idempotent."""
        self.closing = True
        self._closed.set()
        for w in self._all_waiters():
            w.wake()
        if self._timer is not None:
            timer, self._timer = self._timer, None
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer

    def _all_waiters(self) -> Iterator[_Waiter]:
        yield from list(self._claims.values())
        for group in (*self._jobs.values(), *self._workers.values(), self._events):
            yield from list(group)

    # ------------------------------------------------------------ notes (in the writer)

    def note(self, what: str, job_id: str, a: Any, b: Any, c: Any) -> None:
        """Record one trigger row (coordd.store.push); called inside the transaction."""
        self._notes.append((what, job_id, a, b, c))

    def job_waiting(self, job_id: str, role: str, kind: str, run_at: float | None) -> None:
        """A job entered waiting (coordd.store.sqlite.job_changes; `run_at` when still ahead): noted
        while claims are parked or looking, and always for the run_at timer."""
        if run_at is not None or self._claims:
            self._notes.append(("w", job_id, role, kind, run_at))

    def job_ended(self, job_id: str) -> None:
        """A job reached a terminal status (coordd.store.sqlite.job_changes): noted if waited
        for."""
        if job_id in self._jobs:
            self._notes.append(("t", job_id, None, None, None))

    def rolled_back(self) -> None:
        """The batch's transaction failed: nothing it noted happened."""
        self._notes.clear()

    def committed(self) -> None:
        """The batch committed: wake what its notes concern. Never raises."""
        try:
            if self._events and self._db is not None:
                last = push_store.last_event(self._db)
                if last != self._last_event:
                    self._last_event = last
                    for w in self._events:
                        w.wake()
            if self._notes:
                notes, self._notes = self._notes, []
                self._dispatch(notes)
        except Exception:  # a bug here must not fail the writer; waiters time out instead
            self._notes.clear()
            logger.exception("wake-up dispatch failed", extra={"action": "push_failed"})

    def store_note(self, payload: str) -> None:
        """A wake-up a store sends after the commit it concerns (PostgreSQL's NOTIFY,
        coordd.store.postgres.push_sql): "t<job_id>" the job ended, "c<worker_id>" the
        worker's jobs have a new action, "e" new job events; "*" some may have been
        missed: every parked `wait_for` call looks again. Never raises."""
        what, key = payload[:1], payload[1:]
        if what == "t":
            group: Iterable[_Waiter] = list(self._jobs.get(key, ()))
        elif what == "c":
            group = list(self._workers.get(key, ()))
        elif what == "e":
            group = list(self._events)
        elif what == "*":
            group = [w for g in (*self._jobs.values(), *self._workers.values(), self._events)
                     for w in list(g)]
        else:
            logger.debug("unknown store wake-up %r", payload)
            return
        for w in group:
            w.wake()

    def _dispatch(self, notes: list[tuple[str, str, Any, Any, Any]]) -> None:
        now = self._clock.wall()
        ready: dict[tuple[str, str], int] = {}  # (role, kind) -> jobs now claimable
        limits_freed = False
        for what, job_id, a, b, c in notes:
            if what == "w":
                if isinstance(c, (int, float)) and c > now:
                    heapq.heappush(self._due, (float(c), a, b))
                    if self._due[0][0] == c:
                        self._timer_kick.set()
                else:
                    ready[(a, b)] = ready.get((a, b), 0) + 1
            elif what == "t":
                for w in self._jobs.get(job_id, ()):
                    w.wake()
            elif what == "c" and a is not None:
                for w in self._workers.get(a, ()):
                    w.wake()
            elif what == "h":  # a heartbeat (job_id is the worker id, a its roles JSON)
                self.heartbeat(job_id, frozenset(_roles(a)))
            elif what == "l":  # units of limit `a` freed
                limits_freed = True
        for (role, kind), n in ready.items():  # one pass per (role, kind), not per job
            self.job_ready(role, kind, n)
        if limits_freed:
            self.limits_changed()

    # ------------------------------------------------------------ caps

    @contextlib.contextmanager
    def _slot(self, w: _Waiter) -> Iterator[None]:
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

    async def _sleep(self, w: _Waiter, deadline: float) -> bool:
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
        again."""
        for w in self._claims.values():
            if not self._may_take(w, role, kind):
                continue
            if not w.idle:
                w.dirty = True
            elif n > 0 and not w.credits:
                w.credits.append((role, kind))
                w.wake()
                n -= 1

    def _forward(self, credits: list[tuple[str, str]], after: int) -> None:
        """Pass credits a claim could not use on to the next idle parked claims after it."""
        for role, kind in credits:
            for w in self._claims.values():
                if w.seq > after and w.idle and not w.credits and self._may_take(w, role, kind):
                    w.credits.append((role, kind))
                    w.wake()
                    break

    def _may_take(self, w: _ClaimWaiter, role: str, kind: str) -> bool:
        if w.kinds is not None and kind not in w.kinds:
            return False
        roles = self.roles.get(w.worker_id)
        return roles is None or role in roles

    def heartbeat(self, worker_id: str, roles: frozenset[str]) -> None:
        """A heartbeat from `worker_id` was committed (a trigger noted it while claims are
        parked): its gates may have opened, or its roles changed: its parked claims that
        were refused look again."""
        changed = self.roles.get(worker_id) != roles
        self.roles[worker_id] = roles
        for w in self._claims.values():
            if w.worker_id == worker_id and (w.gated or changed):
                w.wake()

    def limits_changed(self) -> None:
        """Units of a fleet-wide limit freed, or a limit changed: the parked claims a
        limit refused look again."""
        for w in self._claims.values():
            if w.limited:
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
        w = _ClaimWaiter(PARK_SCOPE.get(), next(self._seq), worker_id,
                         None if kinds is None else frozenset(kinds))
        # the roles noted last may be stale (noted only while claims are parked): unknown
        # until this worker's next heartbeat, so any job may wake it (it looks, or parks)
        self.roles.pop(worker_id, None)
        start = self._clock.mono()
        deadline = start + wait_s
        for old in self._claims.values():
            if old.worker_id == worker_id:
                old.superseded = True
                old.wake()
        with self._slot(w):
            if not self._claims:
                self._flag(push_store.claims_parked, True)
            self._claims[w.seq] = w
            try:
                while True:
                    w.dirty = False
                    used, w.credits = w.credits, []
                    res = await attempt(self._clock.mono() - start)
                    if getattr(res, "job", None) is not None:
                        return res
                    reasons = getattr(res, "reasons", None) or ()
                    w.gated = any(r != NO_MATCHING_ROLE for r in reasons)
                    w.limited = LIMIT_REFUSED in reasons
                    slot = getattr(res, "next_slot_s", None)  # a rate frees a unit then
                    if used and reasons:
                        self._forward(used, w.seq)
                    if w.dropped or self.closing:
                        return res
                    if w.dirty or w.credits:
                        continue
                    w.idle = True
                    until = deadline if slot is None else \
                        min(deadline, self._clock.mono() + slot + DUE_SLACK_S)
                    try:
                        woken = await self._sleep(w, until)
                    finally:
                        w.idle = False
                    if not woken and until < deadline and not (w.dropped or self.closing):
                        continue  # a rate slot came free: look again
                    if not woken or w.dropped or self.closing:
                        if hasattr(res, "waited_s"):  # the whole wait, not the last look's
                            res.waited_s = self._clock.mono() - start
                        return res
            finally:
                del self._claims[w.seq]
                if not self._claims:
                    self._flag(push_store.claims_parked, False)
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
        w = _Waiter(PARK_SCOPE.get())
        deadline = self._clock.mono() + wait_s
        if group == "events":
            registry: set[_Waiter] = self._events
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

    # ------------------------------------------------------------ run_at timer

    async def _run_timer(self) -> None:
        """Wake parked claims as scheduled jobs come due (one wait, for the earliest)."""
        while not self.closing:
            now = self._clock.wall()
            while self._due and self._due[0][0] <= now:
                _, role, kind = heapq.heappop(self._due)
                self.job_ready(role, kind)
            delay = self._due[0][0] - now + DUE_SLACK_S if self._due else TIMER_IDLE_S
            self._timer_kick.clear()
            await self._clock.wait(self._timer_kick, delay)
