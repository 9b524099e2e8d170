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

from coordd import errors, store, values
from coordd.config import MESSAGE_VISIBILITY_MAX_S, Config
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
VISIBILITY_MAX_S = MESSAGE_VISIBILITY_MAX_S
TTL_MAX_S = 10 * 365 * 86400.0
READ_REPLY_BYTES_MAX = 4 << 20  # encoded messages per read reply (and <= half the frame cap)
AGENTS_LIMIT_MAX = 1000  # agents per get_agent_status page (AgentQuery.limit's default: 100)
AGENT_METADATA_MAX_BYTES = 16 << 10  # so a page of agents fits well within a frame

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

    async def _send(self, p: BroadcastMessage, recipient: str | None) -> SendResult:
        check_name("sender", p.sender)
        check_name("message_type", p.message_type, TYPE_MAX_CHARS)
        if p.priority not in PRIORITIES:
            raise errors.BadRequest(f"priority must be 0..3, got {p.priority}")
        if p.ttl_s is not None and not (0 < p.ttl_s <= TTL_MAX_S):
            raise errors.BadRequest(f"ttl_s must be > 0 and <= {TTL_MAX_S:g}, got {p.ttl_s}")
        if p.message_id is not None:
            check_name("message_id", p.message_id)
        cap = self._cap()
        content = values.encode("content", p.content, cap)
        metadata = None if p.metadata is None else values.encode("metadata", p.metadata, cap)
        names = (p.sender, recipient or "", p.message_type, p.message_id or "")
        encoded = (len(_msgpack(p.content)) + len(_msgpack(p.metadata))
                   + sum(len(n.encode()) for n in names) + 256)  # + ids, times, keys
        if encoded > self._config.max_frame_bytes // 2:  # so any one message fits a read
            raise errors.PayloadTooLarge(
                f"content and metadata are {encoded} bytes encoded; the cap is half the "
                f"{self._config.max_frame_bytes}-byte frame cap")
        ttl = p.ttl_s

        def op(conn: sqlite3.Connection, now: float) -> SendResult:
            expires_at = None if ttl is None else now + ttl
            new = msg_store.NewMessage(
                message_id=p.message_id or secrets.token_hex(8), sender=p.sender,
                recipient=recipient, message_type=p.message_type, content_json=content,
                priority=p.priority, metadata_json=metadata, expires_at=expires_at)
            mid, created, stored_expiry = msg_store.send(conn, now, new)
            return SendResult(message_id=mid, created=created, expires_at=stored_expiry)
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
        frame = self._config.max_frame_bytes
        budget = min(READ_REPLY_BYTES_MAX, frame // 2)

        def op(conn: sqlite3.Connection, now: float) -> tuple[int, list[MessageView], float]:
            views: list[MessageView] = []  # built here: the op may run again after a retry
            size = 0

            def take(row: tuple[Any, ...]) -> bool:
                """Count the message's encoded bytes (the whole view) against the budget."""
                nonlocal size
                view = _message_view(row)
                n = len(_msgpack(view))
                if views and size + n > budget:
                    return False
                if n > frame // 2:  # only a message stored before the send-side cap
                    raise errors.PayloadTooLarge(
                        f"message {view.message_id} is {n} bytes encoded, over half the "
                        f"{frame}-byte frame cap; nothing was delivered")
                size += n
                views.append(view)
                return True
            acked = msg_store.ack(conn, now, p.reader, p.ack)
            msg_store.read(conn, now, p.reader, p.limit, visibility, p.ack_on_read, take)
            return acked, views, now
        acked, views, now = await self._writer.run(op)
        return ReadResult(messages=views, acked=acked,
                          visible_until=None if p.ack_on_read or not views else now + visibility)

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
        cap = min(AGENT_METADATA_MAX_BYTES, self._cap())
        metadata = None if p.metadata is None else values.encode("metadata", p.metadata, cap)
        await self._writer.run(
            lambda conn, now: msg_store.update_agent(conn, now, p.name, p.status, metadata))
        return (await self.get_agent_status(AgentQuery(name=p.name))).agents[0]

    async def get_agent_status(self, p: AgentQuery) -> AgentsResult:
        """The agent named, or a page of agents by name (`limit`, `after`), with heartbeat
        age, liveness and unread count. A page also stops before its reply would pass
        half the frame cap; `next_after` is then set.

        Raises: NotFound (a name was given and no such agent reported), BadRequest.
        """
        if p.name is not None:
            check_name("name", p.name)
        if p.after is not None:
            check_name("after", p.after)
        if not 1 <= p.limit <= AGENTS_LIMIT_MAX:
            raise errors.BadRequest(f"limit must be 1..{AGENTS_LIMIT_MAX}, got {p.limit}")
        now = self._clock.wall()
        rows = await self._read(msg_store.agents, now, p.name, p.after, p.limit)
        if p.name is not None and not rows:
            raise errors.NotFound(f"agent {p.name} has never reported a status")
        stale = self._config.agent_stale_s
        budget, size = self._config.max_frame_bytes // 2, 0
        agents: list[AgentView] = []
        for name, status, meta, hb, first, unread in rows:
            view = AgentView(name=name, status=status, metadata=store.lenient_json(meta),
                             heartbeat_at=hb, heartbeat_age_s=max(0.0, now - hb),
                             live=now - hb <= stale, first_seen_at=first, unread=unread)
            size += len(_msgpack(view))
            if agents and size > budget:
                break
            agents.append(view)
        more = len(agents) < len(rows) or len(rows) == p.limit
        return AgentsResult(agents=agents,
                            next_after=agents[-1].name if more and p.name is None else None)

    async def purge_agents(self, now: float | None = None) -> int:
        """Forget agents whose last status is older than `message_retention_s` (coordd's
        clock unless `now` is given); return how many."""
        retention = self._config.message_retention_s
        total = 0
        while True:
            n = await self._writer.run(lambda conn, wall: msg_store.purge_agents(
                conn, (wall if now is None else now) - retention))
            total += n
            if n < msg_store.PURGE_BATCH:
                return total

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


_msgpack = msgspec.msgpack.Encoder().encode


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
