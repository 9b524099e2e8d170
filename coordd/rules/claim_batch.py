"""A claim of up to n jobs (`max_jobs`), as n claims in a row: the rule both the Coordinator's
claims (coordd.service.dispatch) and a store's one-write report + next claim
(coordd.store.sqlite) follow, so it is written once.

The rule: the i-th claim (0-based) uses `claim_id` for i = 0 and `claim_id.i` after (a
repeated batch returns the same leases); the first claim that finds nothing ends the
batch, and its reasons say why there are no more. Pure: the caller runs each claim.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from coordd.wire.protocol import ClaimResult, Granted


def batch_claim_id(claim_id: str | None, i: int) -> str | None:
    """The claim id of the `i`-th job (0-based) of a batch claimed with `claim_id`."""
    return claim_id if claim_id is None or i == 0 else f"{claim_id}.{i}"


class NextClaim(msgspec.Struct):
    """A claim decided above the stores, for a store to run after a report in the same
    write: the worker, the clamped lease, the claim policy, kinds, claim id and count (a
    Struct: made on every report that asks for its next job, built without a Python
    __init__)."""

    worker_id: str
    lease_s: float
    policy: Any
    kinds: list[str] | None
    claim_id: str | None
    max_jobs: int


class Batch:
    """One batch claim: `ids()` gives each claim's id until `add` says stop; `result` is
    the combined ClaimResult (first job in `job`/`lease`, the others in `more`)."""

    def __init__(self, claim_id: str | None, max_jobs: int) -> None:
        self._claim_id, self._max = claim_id, max_jobs
        self.result: ClaimResult | None = None
        self._done = False

    def ids(self) -> Iterator[str | None]:
        """The claim id of each claim to run, in order."""
        for i in range(self._max):
            if self._done:
                return
            yield batch_claim_id(self._claim_id, i)

    def add(self, res: ClaimResult) -> bool:
        """Take one claim's result; False once the batch is over (it found nothing)."""
        first = self.result
        if first is None:
            self.result = res
            self._done = res.job is None
        elif res.job is None or res.lease is None:
            first.reasons, first.detail, first.next_slot_s = res.reasons, res.detail, \
                res.next_slot_s
            self._done = True
        else:
            first.more.append(Granted(job=res.job, lease=res.lease))
        return not self._done
