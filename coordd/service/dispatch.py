"""The Coordinator's claims: `claim` (parked with `wait_s`, up to `max_jobs` jobs at once)
and the next claim a lease holder's `complete`, `fail` or `release` makes in the same call
(eager dispatch, coordd.wire.claims.ClaimAsk).

The rule not to break: every job is handed out by the store's one claim (coordd.store.api
`claim`), so priority order, gates, limits, reservations and preemption hold for each job
exactly as for single claims; a batch is that many claims in a row, stopping at the first
that finds nothing. A next claim runs only after its report succeeded: a refused report
(a stale fencing token, already completed) raises before anything is claimed.
"""

from __future__ import annotations

import logging
from typing import Any

from coordd import errors
from coordd.rules.names import NAME_MAX_CHARS, check_name
from coordd.wire.claims import MAX_JOBS_MAX, ClaimAsk
from coordd.wire.protocol import Claim, ClaimResult, Granted
from coordd.wire.workers import Release
from coordd.service.push import PARK_SCOPE

logger = logging.getLogger(__name__)

UNDELIVERED = "claim_undelivered"  # a parked claim's job, granted as its connection closed
NEXT_FAILED = "next_claim_failed"  # the report stored, its next claim did not run (detail)


def batch_claim_id(claim_id: str | None, i: int) -> str | None:
    """The claim id of the `i`-th job (0-based) of a batch claimed with `claim_id`: the
    first keeps it, the others add `.i`, so a repeated batch returns the same leases."""
    return claim_id if claim_id is None or i == 0 else f"{claim_id}.{i}"


def check_claim(worker_id: str, claim_id: str | None, max_jobs: int) -> None:
    """Raise BadRequest for a bad worker id, claim id or `max_jobs` (before anything is
    written)."""
    check_name("worker_id", worker_id)
    if not 1 <= max_jobs <= MAX_JOBS_MAX:
        raise errors.BadRequest(f"max_jobs must be 1..{MAX_JOBS_MAX}, got {max_jobs}")
    if claim_id is not None:
        check_name("claim_id", claim_id,
                   NAME_MAX_CHARS - len(f".{max_jobs - 1}") if max_jobs > 1 else NAME_MAX_CHARS)


def ask_claim(worker_id: str, ask: ClaimAsk) -> Claim:
    """The `claim` params a report's `next` stands for."""
    return Claim(worker_id=worker_id, lease_s=ask.lease_s, claim_id=ask.claim_id,
                 kinds=ask.kinds, max_jobs=ask.max_jobs)


class Dispatch:
    """Mixed into Coordinator (its store, claim policy, push, meters, lease clamp, release)."""

    store: Any
    push: Any
    meters: Any
    _claim_policy: Any

    def _lease_s(self, asked: float | None) -> float:
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

    async def claim_next(self, worker_id: str, ask: ClaimAsk | None) -> ClaimResult | None:
        """The next claim of a report that succeeded (None: not asked). A claim that fails
        (storage, overload) is a result with no job (`next_claim_failed`): the report is
        stored either way, and the worker parks a plain claim."""
        if ask is None:
            return None
        try:
            return await self._claim_batch(ask_claim(worker_id, ask))
        except errors.CoordError as exc:
            logger.warning("next claim for %s failed: %s", worker_id, exc,
                           extra={"action": "claim_next_failed", "worker_id": worker_id})
            return ClaimResult(reasons=[NEXT_FAILED], detail=f"{exc.code}: {exc}")

    async def _claim_batch(self, p: Claim) -> ClaimResult:
        """Up to `p.max_jobs` claims in a row; the first that finds nothing ends the batch
        (its reasons and `next_slot_s` say why)."""
        check_claim(p.worker_id, p.claim_id, p.max_jobs)
        lease_s = self._lease_s(p.lease_s)
        first = await self._claim_one(p, lease_s, p.claim_id)
        if first.job is None:
            return first
        for i in range(1, p.max_jobs):
            res = await self._claim_one(p, lease_s, batch_claim_id(p.claim_id, i))
            if res.job is None or res.lease is None:
                first.reasons, first.detail = res.reasons, res.detail
                first.next_slot_s = res.next_slot_s
                break
            first.more.append(Granted(job=res.job, lease=res.lease))
        return first

    async def _claim_one(self, p: Claim, lease_s: float, claim_id: str | None) -> ClaimResult:
        result: ClaimResult = await self.store.claim(
            p.worker_id, lease_s, self._claim_policy, kinds=p.kinds, claim_id=claim_id)
        if result.job is not None:
            self.meters.claims.inc()
        for reason in result.reasons:
            self.meters.refusals.labels(reason).inc()
        return result
