"""Heartbeats as the Coordinator serves them (issue 30): a full beat goes to the store
(recorded, preemption paced, governance for every held job); a quiet beat, one that changed
nothing that matters (coordd.rules.governance_beat decides), is answered from memory and its
time is stored later, in one batch per maintenance round (`flush_if_due`, run by the
reaper), so liveness checks on stored rows keep their answers. A quiet beat's roles are its
last full beat's: the parked claims (coordd.service.push) are filed under them
(`roles_of`, `Push.beat_roles`), so a job of another role wakes none.

What makes a worker's next beat full again (`CHANGES`; the worker's generation or the
fleet's epoch moves after the call, so a full beat that started before it stays full): its
own claim of a job, renew with an action or a cancel, complete, fail, release or goodbye;
anything that may change another worker's jobs (cancel, workflow_cancel, retry,
forget_worker, a reap or a workflow round that did something); a preemption (its victim's
worker); a job enqueued at a priority that may preempt (beats are full for one scan
interval, so the walk runs at once), and while such a job waits (each beat drives the
paced walk, as before).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from coordd.rules import governance_beat as gb
from coordd.service.checks import checked_readings
from coordd.service.lifecycle import heartbeat_state, log_lost
from coordd.store.api_governance import GovernedHeartbeat, WorkerBeat
from coordd.wire.governance import JobAction
from coordd.wire.protocol import Heartbeat, HeartbeatResult


def _always(_result: Any) -> bool:
    return True


# method -> (changes only its caller's worker, whether its result changed anything)
CHANGES: dict[str, tuple[bool, Callable[[Any], bool]]] = {
    "_claim_batch": (True, lambda r: r.job is not None),
    "renew": (True, lambda r: r.cancel_requested or (
        r.action is not None and r.action.action != "continue")),
    "complete": (True, _always), "fail": (True, _always), "release": (True, _always),
    "goodbye": (True, _always),
    "cancel": (False, _always), "workflow_cancel": (False, _always),
    "retry": (False, _always), "forget_worker": (False, _always),
    "reap": (False, lambda r: r.reaped > 0),
    "workflow_tick": (False, lambda r: any(r)),
}
ENQUEUES = ("enqueue", "enqueue_batch")

logger = logging.getLogger(__name__)


class _Seen:
    """One worker's last full beat and its last-seen times (monotonic seconds)."""

    __slots__ = ("key", "rest", "src", "limits", "sig", "actions", "offset", "step",
                 "epoch", "gen", "full_at", "stored_at", "seen_at", "readings", "unsure")

    def __init__(self, key: tuple[Any, ...], readings: dict[str, Any], src: Any,
                 policies: tuple[Any, ...], actions: list[JobAction] | None, offset: float,
                 epoch: int, gen: int, at: float) -> None:
        self.key, self.src, self.actions = key, src, actions
        self.limits = gb.thresholds(policies)  # every threshold that applies to it
        self.rest, self.sig = gb.rest(readings), gb.signature(self.limits, readings)
        self.offset, self.epoch, self.gen = offset, epoch, gen
        self.step = 0.0  # the wall clock's step from coordd's clock then (AnchoredClock.step)
        self.full_at = self.stored_at = self.seen_at = at
        self.readings: dict[str, Any] | None = None  # a quiet beat's, not yet stored
        self.unsure = False  # a later full beat failed: the stored roles may be its


class Beats:
    """The heartbeat method and the in-memory last-seen times of one Coordinator.

    `quiet` and `full` count the beats answered each way (tests, benches)."""

    def __init__(self, coord: Any) -> None:
        self._coord = coord
        self._clock = coord.clock
        self.timing = gb.timing(coord.config.heartbeat_stale_s, coord.config.reaper_interval_s)
        self._seen: dict[str, _Seen] = {}
        self._gen: dict[str, int] = {}
        self._epoch = 0
        self._storing: dict[str, int] = {}  # worker id -> its full beats under way
        self._next_flush = self._clock.mono() + self.timing.flush_s
        self.quiet = self.full = 0
        self._artifact_dir: tuple[str | None] | None = None
        self._install(coord)

    # ------------------------------------------------------------ the method

    async def heartbeat(self, p: Heartbeat) -> HeartbeatResult:
        """The Coordinator's `heartbeat` (its docstring has the contract)."""
        readings, key = self._parsed(p)
        return self._quiet(p, readings, key) or self._finish(
            p, await self._full(p, readings, key, self._clock.mono()))

    def quiet_reply(self, p: Heartbeat) -> HeartbeatResult | None:
        """`heartbeat`'s answer if `p` is quiet (answered from memory, no await), else
        None: then `heartbeat` must be called. Raises: as `heartbeat`."""
        return self._quiet(p, *self._parsed(p))

    def _parsed(self, p: Heartbeat) -> tuple[dict[str, Any], tuple[Any, ...]]:
        """`p`'s checked readings and what a quiet beat must repeat of its last full one.
        Raises: as `heartbeat`."""
        readings, _ = checked_readings(p, self._coord.config.max_payload_bytes)
        return readings, (p.roles, p.incarnation, *heartbeat_state(p))

    def _quiet(self, p: Heartbeat, readings: dict[str, Any], key: tuple[Any, ...]
               ) -> HeartbeatResult | None:
        seen = self._seen.get(p.worker_id)
        if seen is None:
            return None
        at = self._clock.mono()
        if not self._is_quiet(seen, p.worker_id, key, readings, at):
            return None
        seen.seen_at = at
        seen.readings = readings  # stored with the next flush: views lag a round
        self.quiet += 1
        self._coord.push.beat_roles(p.worker_id, p.roles)  # its parked claims learn them
        return self._finish(p, HeartbeatResult(now=self._clock.wall() + seen.offset,
                                               actions=list(seen.actions or ())))

    def _finish(self, p: Heartbeat, res: HeartbeatResult) -> HeartbeatResult:
        coord = self._coord
        coord.web.readings.add(p.worker_id, res.now, p.readings)  # the web view's history
        if self._artifact_dir is None:  # fixed per store; a realpath each call costs
            self._artifact_dir = (coord.artifact_dir,)
        res.artifact_dir = self._artifact_dir[0]  # None: send files with artifact_put
        return res

    def _is_quiet(self, seen: _Seen, worker_id: str, key: tuple[Any, ...],
                  readings: dict[str, Any], at: float) -> bool:
        t = self.timing
        return (seen.actions is not None and not seen.unsure and not self._preempting
                and at >= self._hot_until and seen.epoch == self._epoch
                and seen.gen == self._gen.get(worker_id, 0) and seen.key == key
                and at - seen.stored_at < t.fresh_s and at - seen.full_at < t.refresh_s
                and seen.src is self._coord.governance.policies
                and abs(self._clock.step() - seen.step) <= self._coord.config.clock_step_s
                and gb.rest(readings) == seen.rest
                and gb.signature(seen.limits, readings) == seen.sig)

    async def _full(self, p: Heartbeat, readings: dict[str, Any], key: tuple[Any, ...],
                    at: float) -> HeartbeatResult:
        """`_stored`, with the worker's roles unknown (`roles_of`) while it runs, and after
        it failed (the store may hold this beat's roles, or not) until a full beat ends."""
        wid = p.worker_id
        self._storing[wid] = self._storing.get(wid, 0) + 1
        try:
            return await self._stored(p, readings, key, at)
        except BaseException:
            if (prev := self._seen.get(wid)) is not None:
                prev.unsure = True  # its next beat is full
            raise
        finally:
            if (n := self._storing.pop(wid) - 1) > 0:
                self._storing[wid] = n

    async def _stored(self, p: Heartbeat, readings: dict[str, Any], key: tuple[Any, ...],
                      at: float) -> HeartbeatResult:
        coord = self._coord
        epoch, gen = self._epoch, self._gen.get(p.worker_id, 0)
        beat = WorkerBeat(incarnation=key[1], kinds_json=key[2], broken_json=key[3])
        pacer, looks = coord.governance.preemptor, coord.governance.preemptor.looks
        got: GovernedHeartbeat = await coord.store.heartbeat_governed(
            p.worker_id, p.roles, readings, beat, coord.governance)
        self._preempting = pacer.looks != looks
        self.full += 1
        log_lost(p.worker_id, got.result.lost, "restarted (new incarnation)")
        coord.meters.count_governance(p.worker_id, got.changes, got.preempted)
        self._preempted(got.preempted)
        res = got.result
        calm = not res.cancel and not res.lost and all(a.action == "continue"
                                                       for a in res.actions)
        old = self._seen.get(p.worker_id)
        src = coord.governance.policies
        seen = _Seen(key, readings, src, gb.policies_of(src, got.held),
                     list(res.actions) if calm else None, res.now - self._clock.wall(),
                     epoch, gen, at)
        seen.step = self._clock.step()  # a step past clock_step_s: the next beat is full
        if old is not None and old.seen_at > at:  # a quiet beat while this one ran
            seen.seen_at = old.seen_at
        self._seen[p.worker_id] = seen
        return res

    def roles_of(self, worker_id: str) -> frozenset[str] | None:
        """The roles `worker_id`'s last full beat stored (its quiet beats carry the same),
        or None: unknown (no beat seen here lately, one under way, or the last failed)."""
        seen = self._seen.get(worker_id)
        if seen is None or seen.unsure or worker_id in self._storing:
            return None
        return frozenset(seen.key[0])

    # ------------------------------------------------------------ what makes beats full

    _preempting = False  # the last walk found a job that may preempt waiting: beats drive
    # the paced walk (coordd.rules.preemption.Preemptor) as every beat did before
    _hot_until = float("-inf")  # a job that may preempt was enqueued: beats are full
    # until then (one preemption scan interval), so the walk runs at once

    def changed(self, worker_id: str | None) -> None:
        """A worker's jobs may have changed (None: any worker's)."""
        if worker_id is None:
            self._epoch += 1
        else:
            self._gen[worker_id] = self._gen.get(worker_id, 0) + 1

    def _preempted(self, preempted: list[tuple[str, str, str]]) -> None:
        for _job, _victim, holder in preempted:
            self.changed(holder)

    def _install(self, coord: Any) -> None:
        """Wrap the Coordinator's methods that change what a heartbeat answers: after each
        call (a full beat that started before it then stays full), the worker's generation
        or the epoch moves, unless the result says nothing changed."""
        def wrap(name: str, own: bool, matters: Callable[[Any], bool]) -> None:
            fn = getattr(coord, name)

            @functools.wraps(fn)
            async def call(*args: Any, **kw: Any) -> Any:
                ok = False
                try:
                    result = await fn(*args, **kw)
                    ok = True
                    return result
                finally:
                    if not ok or matters(result):
                        self.changed(getattr(args[0], "worker_id", None) if own else None)
            setattr(coord, name, call)

        for name, (own, matters) in CHANGES.items():
            wrap(name, own, matters)  # a name missing here raises: the table must follow
        gap = coord.governance.preemptor.policy.gap
        for name in ENQUEUES:
            if gap > 0:
                setattr(coord, name, self._watch_enqueue(getattr(coord, name), 3 - gap))

    def _watch_enqueue(self, fn: Callable[..., Awaitable[Any]], top: int
                       ) -> Callable[..., Awaitable[Any]]:
        scan_s = self._coord.governance.preemptor.policy.scan_interval_s

        @functools.wraps(fn)
        async def call(p: Any, *args: Any, **kw: Any) -> Any:
            result = await fn(p, *args, **kw)
            jobs = getattr(p, "jobs", None) or [p]
            if any(getattr(j, "priority", 3) <= top for j in jobs):
                self._hot_until = self._clock.mono() + scan_s
            return result
        return call

    # ------------------------------------------------------------ storing last-seen

    async def flush_if_due(self) -> int | None:
        """`flush` when `flush_s` passed since the last one (monotonic); None otherwise."""
        at = self._clock.mono()
        if at < self._next_flush:
            return None
        self._next_flush = at + self.timing.flush_s
        return await self.flush()

    async def flush(self) -> int:
        """Store every last-seen time kept in memory in one batch (and run the paced
        preemption walk with it); forget workers not seen for `refresh_s`. Returns how
        many times were stored. Raises: the store's errors (the times stay pending)."""
        at = self._clock.mono()
        due = [(w, s, s.seen_at, s.readings) for w, s in self._seen.items()
               if s.seen_at > s.stored_at]
        pacer, looks = self._coord.governance.preemptor, self._coord.governance.preemptor.looks
        preempted = await self._coord.store.touch_workers(
            [(w, at - seen_at, readings) for w, _, seen_at, readings in due],
            self._coord.governance)
        self._preempting = pacer.looks != looks
        for _, s, seen_at, readings in due:
            s.stored_at = max(s.stored_at, seen_at)
            if s.readings is readings:  # none newer arrived while the batch was stored
                s.readings = None
        if preempted:
            self._coord.meters.count_governance("", [], preempted)
            self._preempted(preempted)
        for w in [w for w, s in self._seen.items()
                  if s.seen_at <= s.stored_at and at - s.seen_at > self.timing.refresh_s]:
            del self._seen[w]
        return len(due)

    async def close(self) -> None:
        """Store the pending last-seen times at shutdown (best effort: the restart grace
        covers what is lost). Never raises."""
        if not any(s.seen_at > s.stored_at for s in self._seen.values()):
            return
        try:
            await self.flush()
        except Exception as exc:  # a store already gone: the restart grace covers it
            logger.warning("last-seen times not stored at shutdown: %s", exc,
                           extra={"action": "liveness_flush_failed"})

    async def restarted(self) -> int:
        """The restart grace's liveness part (coordd.rules.governance_beat.restart_bound_s):
        run when this coordd starts serving. Returns how many workers it moved."""
        bound = gb.restart_bound_s(self.timing)
        if bound <= 0:
            return 0
        return await self._coord.store.liveness_grace(  # type: ignore[no-any-return]
            bound, self.timing.stale_s)
