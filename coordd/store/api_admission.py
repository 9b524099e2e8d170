"""The store interface's admission part: fleet-wide limits' storage (runtime overrides,
the `limits` views) and a `complete` that counts reported usage against budgets in the
same transaction. Claims judge limits, aging and per-job gates through `Store.claim`
(its ClaimPolicy carries the LimitBook and aging_interval_s); `Store.enqueue` stores the
limits, gate overrides and result schema a NewJob names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from coordd.wire.protocol import CompleteResult
from coordd.wire.limits import LimitView
from coordd.store.api import Backoff, LeaseRef

if TYPE_CHECKING:
    from coordd.rules.claim_batch import NextClaim
    from coordd.rules.limits import LimitBook


class AdmissionStore(Protocol):
    """Limits' storage, the same replies and errors on every store."""

    async def complete_counted(self, ref: LeaseRef, result_json: str | None,
                               usage: dict[str, float] | None, book: LimitBook,
                               backoff: Backoff, *, artifact: Any = None,
                               now: float | None = None, then: NextClaim | None = None
                               ) -> CompleteResult:
        """`complete` (a result failing its schema spends the attempt after `backoff`),
        then `usage` counted against the budgets of the job's limits, in one transaction.
        Raises: as Store.complete."""
        ...

    async def limit_reasons(self, waiting: list[tuple[str, int]], book: LimitBook, *,
                            now: float | None = None) -> dict[str, str]:
        """job_id -> why its limits hold it back now, for the waiting jobs
        [(job_id, priority)] that a limit holds back."""
        ...

    async def limits_loaded(self, book: LimitBook) -> None:
        """The coordinator installed its limits (config and stored overrides): a store
        may settle what it keeps for them (SQLite: its release trigger)."""
        ...

    async def limit_overrides(self) -> list[tuple[str, dict[str, Any]]]:
        """The stored runtime overrides [(name, settings)] (undecodable rows skipped)."""
        ...

    async def set_limit_override(self, name: str, settings: dict[str, Any] | None,
                                 rate_dropped: bool, *, now: float | None = None) -> None:
        """Store (None: delete) the runtime override of `name`; `rate_dropped` forgets
        its rate window."""
        ...

    async def job_limits(self, job_id: str, priority: int, waiting: bool, book: LimitBook,
                         *, now: float | None = None) -> tuple[list[tuple[str, int]], str | None]:
        """The limits a job consumes [(name, units)] and, for a `waiting` job, why they
        hold it back now (None: they do not)."""
        ...

    async def limit_views(self, book: LimitBook, names: list[str], holders: bool, *,
                          now: float | None = None) -> tuple[list[LimitView], float]:
        """The views of the limits `names` (coordd.rules.limits.limit_view) and the
        store's now."""
        ...


__all__ = ["AdmissionStore"]
