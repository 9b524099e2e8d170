"""The hub on SQLite (coordd.store.api_hub.HubStore): coordd.store.messages' functions run
as ops of the single writer, reads on the read pool.

`SQLiteHubOps` is a mixin of SQLiteStore (its `writer`, `readers` and `_clock`).
`now=None` takes the writer's `now` (coordd's clock); a pinned `now` replaces it for that
op only.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import msgspec

from coordd.clock import Clock
from coordd.rules.hub_views import ReadBudget, agent_view
from coordd.wire.protocol import AgentView, ReadResult, SendResult
from coordd.store.sqlite.readers import ReadPool
from coordd.store import messages as msg_store
from coordd.store.sqlite.writer import Writer


class SQLiteHubOps:
    """HubStore over the single writer (see the module docstring)."""

    writer: Writer
    readers: ReadPool
    _clock: Clock

    async def _hub_write(self, fn: Any, now: float | None) -> Any:
        if now is None:
            return await self.writer.run(fn)
        return await self.writer.run(lambda conn, _now: fn(conn, now))

    async def send_message(self, msg: msg_store.NewMessage, ttl_s: float | None, *,
                           now: float | None = None) -> SendResult:
        """Store a message (coordd.store.messages.send). Raises: errors.BadRequest."""
        def op(conn: sqlite3.Connection, t: float) -> SendResult:
            new = msgspec.structs.replace(msg, expires_at=None if ttl_s is None else t + ttl_s)
            mid, created, stored_expiry = msg_store.send(conn, t, new)
            return SendResult(message_id=mid, created=created, expires_at=stored_expiry)
        return await self._hub_write(op, now)

    async def read_messages(self, reader: str, limit: int, visibility_s: float,
                            ack_on_read: bool, ack: Sequence[str], frame_bytes: int, *,
                            now: float | None = None) -> ReadResult:
        """Ack, then deliver within the read budget, in one op. Raises: PayloadTooLarge."""
        def op(conn: sqlite3.Connection, t: float) -> tuple[int, ReadBudget, float]:
            budget = ReadBudget(frame_bytes)  # built here: the op may run again after a retry
            acked = msg_store.ack(conn, t, reader, list(ack))
            msg_store.read(conn, t, reader, limit, visibility_s, ack_on_read, budget.take)
            return acked, budget, t
        acked, budget, t = await self._hub_write(op, now)
        return ReadResult(messages=budget.views, acked=acked,
                          visible_until=None if ack_on_read or not budget.views
                          else t + visibility_s)

    async def ack_messages(self, reader: str, message_ids: Sequence[str], *,
                           now: float | None = None) -> int:
        """Mark the reader's deliveries processed (coordd.store.messages.ack)."""
        return await self._hub_write(
            lambda conn, t: msg_store.ack(conn, t, reader, list(message_ids)), now)

    async def update_agent(self, name: str, status: str, metadata_json: str | None, *,
                           now: float | None = None) -> None:
        """Record an agent's status (coordd.store.messages.update_agent)."""
        await self._hub_write(
            lambda conn, t: msg_store.update_agent(conn, t, name, status, metadata_json), now)

    async def agents(self, name: str | None, after: str | None, limit: int, stale_s: float,
                     *, now: float | None = None) -> list[AgentView]:
        """A page of agents on the read pool at coordd's clock (or `now`)."""
        t = self._clock.wall() if now is None else now
        rows = await self.readers.run(msg_store.agents, t, name, after, limit)
        return [agent_view(row, t, stale_s) for row in rows]

    async def purge_messages(self, retention_s: float, *, now: float | None = None) -> int:
        """One batch of coordd.store.messages.purge."""
        return await self._hub_write(
            lambda conn, t: msg_store.purge(conn, t, t - retention_s), now)

    async def purge_agents(self, retention_s: float, *, now: float | None = None) -> int:
        """One batch of coordd.store.messages.purge_agents."""
        return await self._hub_write(
            lambda conn, t: msg_store.purge_agents(conn, t - retention_s), now)
