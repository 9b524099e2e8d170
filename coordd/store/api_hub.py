"""The hub's part of the store interface (coordd.store.api): messages between agents,
their delivery to each reader, agents' status.

Both stores hold the rules of coordd.service.hub's module docstring (at least once with an ack
and a visibility timeout, broadcasts per reader, expiry on the store's clock). Every call
takes `now` like the rest of the store interface: None in production (the store's clock),
a pinned Unix time in tests. Checks of names and sizes are coordd.service.hub's, made before a
store is called.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from coordd.wire.protocol import AgentView, ReadResult, SendResult
from coordd.store.messages import NewMessage


class HubStore(Protocol):
    """The hub's operations over one database (see the module docstring)."""

    async def send_message(self, msg: NewMessage, ttl_s: float | None, *,
                           now: float | None = None) -> SendResult:
        """Store `msg` (expiring at now + `ttl_s` if given; `msg.expires_at` is ignored).
        A repeated id from the same sender to the same recipient returns created=False
        and the stored expiry. Raises: errors.BadRequest (the id is another message's)."""
        ...

    async def read_messages(self, reader: str, limit: int, visibility_s: float,
                            ack_on_read: bool, ack: Sequence[str], frame_bytes: int, *,
                            now: float | None = None) -> ReadResult:
        """Ack `ack`, then deliver up to `limit` of the reader's messages in inbox order
        (P0 first, then oldest) within coordd.rules.hub_views.ReadBudget, in one transaction.
        Raises: errors.PayloadTooLarge (ReadBudget; nothing is acked or delivered)."""
        ...

    async def ack_messages(self, reader: str, message_ids: Sequence[str], *,
                           now: float | None = None) -> int:
        """Mark the reader's deliveries processed; return how many changed (idempotent)."""
        ...

    async def update_agent(self, name: str, status: str, metadata_json: str | None, *,
                           now: float | None = None) -> None:
        """Record an agent's status and heartbeat (metadata None keeps the stored one)."""
        ...

    async def agents(self, name: str | None, after: str | None, limit: int, stale_s: float,
                     *, now: float | None = None) -> list[AgentView]:
        """The agent `name`, or up to `limit` agents named after `after` in code point
        order, with liveness (`stale_s`) and unread counts at `now`."""
        ...

    async def purge_messages(self, retention_s: float, *, now: float | None = None) -> int:
        """Delete one batch each of expired messages, processed ones and broadcasts older
        than `retention_s`; return how many (0: nothing left to delete)."""
        ...

    async def purge_agents(self, retention_s: float, *, now: float | None = None) -> int:
        """Forget one batch (coordd.store.messages.PURGE_BATCH) of agents not heard from
        for `retention_s`; return how many."""
        ...


__all__ = ["HubStore"]
