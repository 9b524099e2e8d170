"""The Coordinator's claims: `claim` (parked with `wait_s`, up to `max_jobs` jobs at once)
and the next claim a lease holder's `complete`, `fail` or `release` makes in the same call
(eager dispatch, coordd.wire.claims.ClaimAsk).

The rule not to break: every job is handed out by the store's one claim (coordd.store.api
`claim`), so priority order, gates, limits, reservations and preemption hold for each job
exactly as for single claims; a batch is that many claims in a row, stopping at the first
that finds nothing (coordd.rules.claim_batch). A next claim runs only after its report
succeeded: a refused report (a stale fencing token, already completed) raises before
anything is claimed. The store runs the report and its next claim in one write, the
claims decided here (NextClaim); where it cannot (it leaves `next` None: PostgreSQL for
a claim of several jobs) they are two.
"""

from __future__ import annotations

import logging
from typing import Any

from coordd import errors
from coordd.rules.claim_batch import Batch, NextClaim
from coordd.rules.names import NAME_MAX_CHARS, check_name
from coordd.wire.claims import MAX_JOBS_MAX, ClaimAsk
from coordd.wire.protocol import Claim, ClaimResult, Granted
from coordd.wire.workers import Release
from coordd.service.push import PARK_SCOPE

logger = logging.getLogger(__name__)

UNDELIVERED = "claim_undelivered"  # a parked claim's job, granted as its connection closed
NEXT_FAILED = "next_claim_failed"  # the report stored, its next claim did not run (detail)


def check_claim(worker_id: str, claim_id: str | None, max_jobs: int) -> None:
    """Raise BadRequest for a bad worker id, claim id or `max_jobs` (before anything is
    written)."""
    check_name("worker_id", worker_id)
    if not 1 <= max_jobs <= MAX_JOBS_MAX:
        raise errors.BadRequest(f"max_jobs must be 1..{MAX_JOBS_MAX}, got {max_jobs}")
    if claim_id is not None:
        check_name("claim_id", claim_id,
                   NAME_MAX_CHARS - len(f".{max_jobs - 1}") if max_jobs > 1 else NAME_MAX_CHARS)


class Dispatch:
    """Mixed into Coordinator (its store, claim policy, push, meters, lease clamp, release)."""

    store: Any
    push: Any
    meters: Any
    _claim_policy: Any

    def _lease_s(self, asked: float | None, what: str = "lease_s") -> float:
        raise NotImplementedError

    async def release(self, p: Release) -> Any:
        raise NotImplementedError

    async def claim(self, p: Claim) -> ClaimResult:
        """Claim the best jobs for `p.worker_id` (the store's claim, up to `max_jobs`).

        `lease_s` is clamped to [lease_min_s, lease_max_s]. With `wait_s` > 0 and nothing
        to hand out, the call parks (coordd.service.push) up to `wait_s` (cut to
        `park_wait_max_s`) and tries again whenever a job it may take may have become
        claimable; `waited_s` says how long. Raises: BadRequest (a bad name, NaN or
        negative wait_s, max_jobs outside 1..64), Overloaded (parked-call caps).
        """
        wait = self.push.wait_s(p.wait_s)
        if wait <= 0:
            return await self._claim_batch(p)
        scope = PARK_SCOPE.get()

        async def attempt(waited_s: float) -> ClaimResult:
            res = await self._claim_batch(p)
            res.waited_s = waited_s
            if res.job is not None and res.lease is not None and scope is not None \
                    and scope.closed:  # its connection went while the claim ran: nobody
                for g in [Granted(job=res.job, lease=res.lease), *res.more]:  # would hold
                    await self.release(Release(  # the leases; no attempt spent
                        job_id=g.job.job_id, worker_id=p.worker_id, token=g.lease.token,
                        reason=UNDELIVERED))
                return ClaimResult(job=None, reasons=[UNDELIVERED], waited_s=waited_s)
            return res
        return await self.push.claim(p.worker_id, p.kinds, wait, attempt)

    def next_claim(self, p: Any) -> NextClaim | None:
        """The next claim a report's params ask for (None: not asked), checked before the
        report is stored. Raises: BadRequest (a bad claim id, max_jobs, lease_s)."""
        ask: ClaimAsk | None = p.next
        if ask is None:
            return None
        check_claim(p.worker_id, ask.claim_id, ask.max_jobs)
        lease_s = self._lease_s(ask.lease_s, "next.lease_s")  # checked, then clamped
        return NextClaim(worker_id=p.worker_id, lease_s=lease_s,
                         policy=self._claim_policy, kinds=ask.kinds, claim_id=ask.claim_id,
                         max_jobs=ask.max_jobs)

    async def claim_next(self, nxt: NextClaim | None) -> ClaimResult | None:
        """The next claim of a report that succeeded (None: not asked), on a store that ran
        them apart. A claim that fails (storage, overload) is a result with no job
        (`next_claim_failed`): the report is stored either way; the worker parks a claim."""
        if nxt is None:
            return None
        try:
            return await self._claim_batch(Claim(
                worker_id=nxt.worker_id, lease_s=nxt.lease_s, claim_id=nxt.claim_id,
                kinds=nxt.kinds, max_jobs=nxt.max_jobs))  # (clamping again changes nothing)
        except errors.CoordError as exc:
            logger.warning("next claim for %s failed: %s", nxt.worker_id, exc,
                           extra={"action": "claim_next_failed", "worker_id": nxt.worker_id})
            return ClaimResult(reasons=[NEXT_FAILED], detail=f"{exc.code}: {exc}")

    async def _claim_batch(self, p: Claim) -> ClaimResult:
        """Up to `p.max_jobs` claims in a row (coordd.rules.claim_batch)."""
        check_claim(p.worker_id, p.claim_id, p.max_jobs)
        lease_s = self._lease_s(p.lease_s)
        if p.max_jobs == 1:  # a batch of one is its one claim, under `claim_id` itself
            return self.counted(await self.store.claim(
                p.worker_id, lease_s, self._claim_policy, kinds=p.kinds, claim_id=p.claim_id))
        batch = Batch(p.claim_id, p.max_jobs)
        for claim_id in batch.ids():
            if not batch.add(await self.store.claim(
                    p.worker_id, lease_s, self._claim_policy, kinds=p.kinds,
                    claim_id=claim_id)):
                break
        assert batch.result is not None
        return self.counted(batch.result)

    def counted(self, res: ClaimResult | None) -> Any:
        """Count a claim's jobs and refusals in the metrics; returns `res`."""
        if res is not None:
            if res.job is not None:
                self.meters.claims.inc(1 + len(res.more))
            for reason in res.reasons:
                self.meters.refusals.labels(reason).inc()
        return res
