"""The wire Structs of eager dispatch (docs/concepts/leases.md, "Fewer round trips"): the
next claim a lease holder's `complete`, `fail` or `release` makes in the same call. Data only.
"""

from __future__ import annotations

import msgspec

MAX_JOBS_MAX = 64  # jobs one claim may take (`max_jobs`)


class ClaimAsk(msgspec.Struct, kw_only=True):
    """`next` of `complete`, `fail`, `release`: once the job's lease has ended, claim for the
    same worker as a `claim` with these fields would (no wait: with nothing due the reply's
    `next` has no job, and the worker parks a plain claim). Nothing is claimed when the
    report is refused (a stale fencing token, already completed)."""

    lease_s: float | None = None  # None: lease_default_s; clamped to lease_min_s..lease_max_s
    claim_id: str | None = None  # a repeated claim with this id returns the lease it granted
    kinds: list[str] | None = None  # only jobs of these kinds (None = any kind)
    max_jobs: int = 1  # up to this many jobs (1..64), each with its own lease
