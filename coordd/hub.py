"""The agent message hub: messages between agents and their status, in coordd's database.

Delivery rule: **at least once, with an explicit ack and a visibility timeout** (like a
lease). `read_messages` hands a reader its oldest unprocessed messages (P0 first) and
hides them from that reader for `visibility_s`; `ack` (on the next read, or
`ack_messages`) marks them processed for good. A reader that crashes between read and ack
gets the same messages again after the timeout, with `deliveries` > 1 and the same
`message_id` to dedupe on. Why not mark-on-read (at most once): the group commit makes a
read durable before its reply is sent, so a coordd killed between the two, a dropped
connection or an agent dying mid-task would lose the message for good; an agent can
always drop a duplicate it recognizes, but never recover a message it did not see.
`ack_on_read=True` gives the at-most-once behaviour to readers that prefer it.

A broadcast (recipient None) is delivered once to every reader but its sender, each
reader acking its own copy (`message_reads` rows). An expired message (`expires_at <=
now`, coordd's clock at the read) is never delivered; the prune round deletes it.
Agent names are not authenticated: whoever can open the socket may send as any name,
as with worker ids (the socket's mode and group are the trust boundary).

Every write goes through the Writer; validation happens here, before anything is queued.
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from coordd import errors, store
from coordd.config import Config
from coordd.names import check_name
from coordd.clock import Clock
from coordd.protocol import (
    PRIORITIES, AckMessages, AckResult, AgentQuery, AgentsResult, AgentStatusUpdate,
    AgentView, BroadcastMessage, MessageView, ReadMessages, ReadResult, SendMessage, SendResult,
)
from coordd.store import messages as msg_store
from coordd.writer import Writer

TYPE_MAX_CHARS = 64
STATUS_MAX_CHARS = 64
READ_LIMIT_MAX = 100
ACK_IDS_MAX = 1000
VISIBILITY_MAX_S = 12 * 3600.0
TTL_MAX_S = 10 * 365 * 86400.0
READ_REPLY_BYTES_MAX = 4 << 20  # content per read reply (well under the frame cap)

Reader = Callable[..., Awaitable[Any]]


class Hub:
    """The hub's operations over the coordinator's writer and read connection.

    Args:
        writer: the single writer every write goes through.
        read: `await read(fn, *args)` runs `fn(conn, *args)` on the read-only connection.
        config: limits and the visibility timeout.
        clock: coordd's clock (for ages on the read side).
    """

    def __init__(self, writer: Writer, read: Reader, config: Config, clock: Clock) -> None:
        self._writer = writer
        self._read = read
        self._config = config
        self._clock = clock

    async def send_message(self, p: SendMessage) -> SendResult:
        """Store a direct message. Raises: BadRequest, PayloadTooLarge."""
        check_name("recipient", p.recipient)
        return await self._send(p, p.recipient)

    async def broadcast(self, p: BroadcastMessage) -> SendResult:
        """Store a message for every reader but the sender. Raises: BadRequest, PayloadTooLarge."""
        return await self._send(p, None)

    async def _send(self, p: SendMessage | BroadcastMessage, recipient: str | None
                    ) -> SendResult:
        check_name("sender", p.sender)
        check_name("message_type", p.message_type, TYPE_MAX_CHARS)
        if p.priority not in PRIORITIES:
            raise errors.BadRequest(f"priority must be 0..3, got {p.priority}")
        if p.ttl_s is not None and not (0 < p.ttl_s <= TTL_MAX_S):
            raise errors.BadRequest(f"ttl_s must be > 0 and <= {TTL_MAX_S:g}, got {p.ttl_s}")
        if p.message_id is not None:
            check_name("message_id", p.message_id)
        cap = self._cap()
        content = _encode("content", p.content, cap)
        metadata = None if p.metadata is None else _encode("metadata", p.metadata, cap)
        ttl = p.ttl_s

        def op(conn: sqlite3.Connection, now: float) -> SendResult:
            expires_at = None if ttl is None else now + ttl
            new = msg_store.NewMessage(
                message_id=p.message_id or secrets.token_hex(8), sender=p.sender,
                recipient=recipient, message_type=p.message_type, content_json=content,
                priority=p.priority, metadata_json=metadata, expires_at=expires_at)
            mid, created = msg_store.send(conn, now, new)
            return SendResult(message_id=mid, created=created, expires_at=expires_at)
        return await self._writer.run(op)

    def _cap(self) -> int:
        """Bytes of content (and of metadata) a message may have: `message_max_bytes`, and
        at most a quarter of the frame cap, so one message always fits a read's reply."""
        return min(self._config.message_max_bytes, self._config.max_frame_bytes // 4)

    async def read_messages(self, p: ReadMessages) -> ReadResult:
        """Ack `p.ack`, then deliver up to `p.limit` of the reader's messages (see the
        module docstring for the delivery rule). Raises: BadRequest."""
        check_name("reader", p.reader)
        if not 1 <= p.limit <= READ_LIMIT_MAX:
            raise errors.BadRequest(f"limit must be 1..{READ_LIMIT_MAX}, got {p.limit}")
        visibility = self._config.message_visibility_s if p.visibility_s is None \
            else p.visibility_s
        if not (0 < visibility <= VISIBILITY_MAX_S):  # also refuses NaN
            raise errors.BadRequest(f"visibility_s must be > 0 and <= {VISIBILITY_MAX_S:g}")
        _check_ids(p.ack)
        budget = min(READ_REPLY_BYTES_MAX, self._config.max_frame_bytes // 4)

        def op(conn: sqlite3.Connection, now: float) -> tuple[int, list[Any], float]:
            acked = msg_store.ack(conn, now, p.reader, p.ack)
            rows = msg_store.read(conn, now, p.reader, p.limit, visibility, p.ack_on_read,
                                  budget)
            return acked, rows, now
        acked, rows, now = await self._writer.run(op)
        return ReadResult(messages=[_message_view(r) for r in rows], acked=acked,
                          visible_until=None if p.ack_on_read or not rows else now + visibility)

    async def ack_messages(self, p: AckMessages) -> AckResult:
        """Mark the reader's deliveries processed (idempotent). Raises: BadRequest."""
        check_name("reader", p.reader)
        _check_ids(p.message_ids)
        return AckResult(acked=await self._writer.run(
            lambda conn, now: msg_store.ack(conn, now, p.reader, p.message_ids)))

    async def update_agent_status(self, p: AgentStatusUpdate) -> AgentView:
        """Record an agent's status and heartbeat; return the stored view. Raises: BadRequest,
        PayloadTooLarge."""
        check_name("name", p.name)
        check_name("status", p.status, STATUS_MAX_CHARS)
        metadata = None if p.metadata is None else _encode("metadata", p.metadata, self._cap())
        await self._writer.run(
            lambda conn, now: msg_store.update_agent(conn, now, p.name, p.status, metadata))
        return (await self.get_agent_status(AgentQuery(name=p.name))).agents[0]

    async def get_agent_status(self, p: AgentQuery) -> AgentsResult:
        """Every agent (or the one named) with heartbeat age, liveness and unread count.

        Raises: NotFound (a name was given and no such agent reported).
        """
        if p.name is not None:
            check_name("name", p.name)
        now = self._clock.wall()
        rows = await self._read(msg_store.agents, now, p.name)
        if p.name is not None and not rows:
            raise errors.NotFound(f"agent {p.name} has never reported a status")
        stale = self._config.agent_stale_s
        return AgentsResult(agents=[
            AgentView(name=name, status=status, metadata=store.lenient_json(meta),
                      heartbeat_at=hb, heartbeat_age_s=max(0.0, now - hb),
                      live=now - hb <= stale, first_seen_at=first, unread=unread)
            for name, status, meta, hb, first, unread in rows])

    async def purge(self, now: float | None = None) -> int:
        """Delete expired messages, and processed messages and broadcasts past
        `message_retention_s` (coordd's clock unless `now` is given); return how many."""
        retention = self._config.message_retention_s
        total = 0
        while True:
            n = await self._writer.run(lambda conn, wall: msg_store.purge(
                conn, wall if now is None else now, (wall if now is None else now) - retention))
            total += n
            if n == 0:
                return total


def _message_view(row: tuple[Any, ...]) -> MessageView:
    (mid, sender, recipient, mtype, content, prio, meta, created, expires, deliveries) = row
    return MessageView(message_id=mid, sender=sender, recipient=recipient, message_type=mtype,
                       content=store.lenient_json(content), priority=prio,
                       metadata=store.lenient_json(meta), created_at=created,
                       expires_at=expires, deliveries=deliveries)


def _check_ids(ids: list[str]) -> None:
    if len(ids) > ACK_IDS_MAX:
        raise errors.BadRequest(f"at most {ACK_IDS_MAX} message ids per ack, got {len(ids)}")
    for mid in ids:
        check_name("message id", mid)


def _encode(what: str, value: Any, cap: int) -> str:
    try:
        raw = store.json_encode(value)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
        raise errors.BadRequest(f"{what} is not JSON-compatible: {exc}") from exc
    if len(raw) > cap:
        raise errors.PayloadTooLarge(f"{what} is {len(raw)} bytes; the cap is {cap}")
    return raw.decode()

