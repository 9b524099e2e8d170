"""Enrolment tokens in the store interface (coordd.store.api): one-time tokens, kept as
their SHA-256, burnt by the enrolment they admit (coordd.service.enrol).

Every call takes `now` (None in production: the store's clock). A token's checks are
coordd.store.enrol.usable, on the store's clock, again in the transaction that burns it.
"""

from __future__ import annotations

from typing import Protocol

TokenState = tuple[str, float, float | None]  # (worker_id, expires_at, used_at)


class EnrolStore(Protocol):
    """The token operations over one database (see the module docstring)."""

    async def add_token(self, digest: str, worker_id: str, ttl_s: float, *,
                        now: float | None = None) -> float:
        """Store a token's digest for `worker_id`, valid `ttl_s` from now (tokens expired
        a day ago are dropped on the way); return its expires_at."""
        ...

    async def token_state(self, digest: str, *, now: float | None = None
                          ) -> tuple[TokenState | None, float]:
        """(the token's state or None if unknown, the store's now)."""
        ...

    async def burn_token(self, digest: str, serial: str, *, now: float | None = None) -> None:
        """Mark the token used by the certificate `serial`, if usable, in one transaction:
        of two enrolments with one token at most one passes.

        Raises: errors.PermissionDenied (unknown, used or expired).
        """
        ...


__all__ = ["EnrolStore", "TokenState"]
