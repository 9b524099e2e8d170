"""The worker's claims: the claim loop (parked claims naming the kinds with a free slot, up
to as many jobs as free slots), and the next claim its reports carry (eager dispatch: a
`complete`, `fail` or `release` asks coordd for the job that takes the slot it frees).

The rule not to break: the worker never asks for more jobs than it has free slots for
(of the worker, and of every kind a claim names), and a report asks for a next job only
when no claim of the loop is out (the worker was full): a job it is handed is started
before the ended job leaves, so the loop never claims the same slot again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from typing import Any

from coordd import errors
from coordd.client import CallTimeout, Disconnected
from coordd.wire.claims import ClaimAsk
from coordd.wire.protocol import ClaimedJob, ClaimResult
from worker import artifacts
from worker.control import early, until
from worker.jobrun import JobRun, SendStamp
from worker.slots import Slots
from worker.waits import wait_any as _wait_any

logger = logging.getLogger(__name__)

Got = tuple[ClaimedJob, int, float]  # (job, fencing token, monotonic lease deadline)


class ClaimLoop:
    """Mixed into worker.supervisor.Supervisor (its runs, slots, kinds, clients, clock)."""

    worker_id: str
    config: Any
    kinds: Any
    _clock: Any
    _stop: asyncio.Event
    _wake: asyncio.Event
    _runs: dict[str, JobRun]
    _last_heartbeat: float | None
    _link: Any
    _tg: asyncio.TaskGroup | None
    _watch: Any
    _slots: Slots

    async def heartbeat_once(self) -> bool:
        raise NotImplementedError

    def _start_job(self, run: JobRun) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ slots

    def _claimable(self, leaving: JobRun | None = None) -> list[str]:
        """The usable kinds with a free slot (`leaving`: as if that run had ended): a claim
        names only these, so a job of a full kind stays waiting at coordd (where preemption
        can see it) instead of being held here until a slot of its kind frees."""
        held = self._held(leaving)
        return [k for k in self.kinds.usable()
                if k not in self.config.kinds or held.get(k, 0) < self.config.kinds[k].slots]

    def _held(self, leaving: JobRun | None) -> dict[str, int]:
        held: dict[str, int] = {}
        for r in self._runs.values():  # (a run whose report ended its lease holds no slot)
            if r is not leaving and not r.finished.is_set():
                held[r.job.kind] = held.get(r.job.kind, 0) + 1
        return held

    def _free_slots(self, kinds: list[str], leaving: JobRun | None = None) -> int:
        """How many jobs one claim naming `kinds` may take: the worker's free slots, and no
        more than any named kind has free (so no job waits here for a slot)."""
        held = self._held(leaving)
        free = self.config.total_slots - sum(held.values())
        for k in kinds:
            if k in self.config.kinds:
                free = min(free, self.config.kinds[k].slots - held.get(k, 0))
        return max(free, 0)

    def _can_claim(self) -> bool:
        if any(r.waiting_for_slot for r in self._runs.values()):
            return False  # a job already waits for a slot of its kind: take no more
        held = sum(not r.finished.is_set() for r in self._runs.values())
        return held < self.config.total_slots and bool(self._claimable())

    # ------------------------------------------------------------ the claim loop

    async def _claim_loop(self) -> None:
        interval = self.config.claim_interval_s
        while not self._stop.is_set():
            self._wake.clear()
            if not self._can_claim():
                await self._clock.wait(self._wake, interval)
                continue
            stale = (self._last_heartbeat is None  # the heartbeat loop keeps it fresh after
                     or self._clock.mono() - self._last_heartbeat
                     >= 2 * self.config.heartbeat_interval_s)
            if stale and not await self.heartbeat_once():
                await self._clock.wait(self._wake, self._link.delay(interval))
                continue
            asked = self._clock.mono()
            # some kinds full: the claim names the others, parked no longer than the idle
            # poll; a slot that frees meanwhile is claimed for at once by a second claim
            # (this one runs out in the background: every reply is read, none orphaned)
            kinds = self._claimable()
            full = len(kinds) < len(self.kinds.usable())
            wait_s = min(self.config.claim_wait_s, interval) if full else self.config.claim_wait_s
            call = asyncio.ensure_future(self.claim_many(wait_s, kinds,
                                                         self._free_slots(kinds)))
            if full and await self._widened(call, kinds):
                assert self._tg is not None
                self._tg.create_task(self._adopt(call), name="claim-superseded")
                continue
            got = await until(self._stop, call)
            if not got:  # answered early (an older coordd, an error): poll's pause
                if early(self._clock.mono() - asked, self.config.claim_wait_s):
                    await self._clock.wait(self._wake, interval)
                continue
            for one in got:
                self._start_job(self._new_run(one))

    async def _widened(self, call: asyncio.Future[object], kinds: list[str]) -> bool:
        """Wait for `call` (a claim naming `kinds`) to be answered, or for a freed slot
        to make a kind outside `kinds` claimable (True: claim again now), or stop."""
        while not call.done() and not self._stop.is_set():
            await _wait_any(self._wake, future=call)
            if self._wake.is_set() and not call.done():
                self._wake.clear()
                if self._can_claim() and not set(self._claimable()) <= set(kinds):
                    return True
        return False

    async def _adopt(self, call: asyncio.Future[list[Got]]) -> None:
        """Run the jobs a superseded claim still brings (a kind that is full again waits
        for its slot here), so no lease it was granted is left unread."""
        for one in await until(self._stop, call) or ():
            self._start_job(self._new_run(one))

    def _new_run(self, got: Got) -> JobRun:
        return JobRun(job=got[0], token=got[1], deadline=got[2],
                      dir=os.path.join(self.config.work_dir, artifacts.safe_name(got[0].job_id)),
                      kind=self.config.kinds.get(got[0].kind))

    async def claim_once(self, wait_s: float = 0.0, kinds: list[str] | None = None
                         ) -> Got | None:
        """Claim one job of `kinds` (default: the claimable ones): (job, token, monotonic
        lease deadline), or None (see `claim_many`)."""
        got = await self.claim_many(wait_s, kinds, 1)
        return got[0] if got else None

    async def claim_many(self, wait_s: float = 0.0, kinds: list[str] | None = None,
                         max_jobs: int = 1, claim_id: str | None = None) -> list[Got]:
        """Claim up to `max_jobs` jobs of `kinds` (default: the claimable ones), each with
        its own lease: [(job, token, monotonic lease deadline)], [] for none.

        A fresh claim_id per attempt (or `claim_id`: the one a lost report's next claim
        used), resent once on a lost reply, so a lost reply leaves no orphan lease.
        `wait_s` > 0 parks it at coordd; the leases run from send + waited_s.
        """
        claim_id = claim_id or uuid.uuid4().hex
        sent = SendStamp(self._clock)  # re-stamped when the frame is written (a reconnect first)
        for attempt in (1, 2):
            try:
                res = await self._watch.client.claim(
                    self.worker_id, self.config.lease_s, claim_id,
                    kinds=self._claimable() if kinds is None else kinds, wait_s=wait_s,
                    on_sent=sent, max_jobs=max(1, max_jobs))
                break
            except (Disconnected, CallTimeout) as exc:
                if attempt == 2 or self._stop.is_set():
                    self._link.failed(exc)
                    return []
            except errors.CoordError as exc:
                logger.warning("claim refused: %s", exc, extra={"action": "claim_error"})
                return []
        self._link.answered()
        return self._granted(res, sent.at + res.waited_s)

    def _granted(self, res: ClaimResult, since: float) -> list[Got]:
        """The jobs of a claim's result, leases timed from monotonic `since`."""
        if res.job is None or res.lease is None:
            if "heartbeat_stale" in res.reasons:
                self._last_heartbeat = None
            logger.debug("nothing to claim", extra={"action": "claim_none", "reasons": res.reasons})
            return []
        out: list[Got] = []
        for job, lease in [(res.job, res.lease), *((g.job, g.lease) for g in res.more)]:
            logger.info("claimed %s (%s, P%d, attempt %d)", job.job_id, job.kind, job.priority,
                        job.attempts,
                        extra={"action": "claim", "job_id": job.job_id, "token": lease.token})
            out.append((job, lease.token, since + lease.lease_s))
        return out

    # ------------------------------------------------------------ eager dispatch

    def next_ask(self, run: JobRun) -> ClaimAsk | None:
        """The next claim `run`'s report carries: the kinds its end makes claimable, as
        many jobs as slots are then free; None while stopping, or when the loop has a
        claim out or may claim already (the worker was not full)."""
        if self._stop.is_set() or self._can_claim():
            return None
        if any(r.waiting_for_slot for r in self._runs.values() if r is not run):
            return None
        kinds = self._claimable(leaving=run)
        n = self._free_slots(kinds, leaving=run) if kinds else 0
        if n <= 0:
            return None
        return ClaimAsk(lease_s=self.config.lease_s, claim_id=uuid.uuid4().hex, kinds=kinds,
                        max_jobs=n)

    async def take_next(self, run: JobRun, ask: ClaimAsk, res: ClaimResult | None,
                        sent: float, replay: bool) -> None:
        """Start the jobs `run`'s report's next claim brought (leases timed from `sent`,
        when the report was sent), handing them `run`'s slot first: its model has ended.
        `replay`: the report's reply was lost (it was stored): claim again with the same
        claim_id, which returns the leases it granted, if any."""
        if replay:
            got = await self.claim_many(0.0, ask.kinds, ask.max_jobs, claim_id=ask.claim_id)
        else:
            got = [] if res is None else self._granted(res, sent)
        if got:
            self._slots.release(run)
        for one in got:
            self._start_job(self._new_run(one))
