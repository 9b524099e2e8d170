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

Validation happens here, before a store is called; the stores (coordd.store.api_hub:
SQLite's single writer, PostgreSQL) hold the delivery rule in their statements.
"""

from __future__ import annotations

import secrets

from coordd import errors
from coordd.rules import values
from coordd.config import MESSAGE_VISIBILITY_MAX_S, Config
from coordd.rules.hub_views import READ_REPLY_BYTES_MAX, encoded as _msgpack
from coordd.rules.names import check_name
from coordd.wire.protocol import (
    PRIORITIES, AckMessages, AckResult, AgentQuery, AgentsResult, AgentStatusUpdate,
    AgentView, BroadcastMessage, ReadMessages, ReadResult, SendMessage, SendResult,
)
from coordd.store import messages as msg_store
from coordd.store.api_hub import HubStore

TYPE_MAX_CHARS = 64
STATUS_MAX_CHARS = 64
READ_LIMIT_MAX = 100
ACK_IDS_MAX = 1000
VISIBILITY_MAX_S = MESSAGE_VISIBILITY_MAX_S
TTL_MAX_S = 10 * 365 * 86400.0
AGENTS_LIMIT_MAX = 1000  # agents per get_agent_status page (AgentQuery.limit's default: 100)
AGENT_METADATA_MAX_BYTES = 16 << 10  # so a page of agents fits well within a frame

__all__ = ["READ_REPLY_BYTES_MAX", "Hub"]


class Hub:
    """The hub's RPC methods over a store's hub operations.

    Args:
        st: the store (its hub operations: coordd.store.api_hub).
        config: limits and the visibility timeout.
    """

    def __init__(self, st: HubStore, config: Config) -> None:
        self._store = st
        self._config = config

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
        size = (len(_msgpack(p.content)) + len(_msgpack(p.metadata))
                + sum(len(n.encode()) for n in names) + 256)  # + ids, times, keys
        if size > self._config.max_frame_bytes // 2:  # so any one message fits a read
            raise errors.PayloadTooLarge(
                f"content and metadata are {size} bytes encoded; the cap is half the "
                f"{self._config.max_frame_bytes}-byte frame cap")
        new = msg_store.NewMessage(
            message_id=p.message_id or secrets.token_hex(8), sender=p.sender,
            recipient=recipient, message_type=p.message_type, content_json=content,
            priority=p.priority, metadata_json=metadata, expires_at=None)
        return await self._store.send_message(new, p.ttl_s)

    def _cap(self) -> int:
        """Bytes of content (and of metadata) a message may have: `message_max_bytes`, and
        at most a quarter of the frame cap, so one message always fits a read's reply."""
        return min(self._config.message_max_bytes, self._config.max_frame_bytes // 4)

    async def read_messages(self, p: ReadMessages) -> ReadResult:
        """Ack `p.ack`, then deliver up to `p.limit` of the reader's messages (see the
        module docstring for the delivery rule). Raises: BadRequest, PayloadTooLarge."""
        check_name("reader", p.reader)
        if not 1 <= p.limit <= READ_LIMIT_MAX:
            raise errors.BadRequest(f"limit must be 1..{READ_LIMIT_MAX}, got {p.limit}")
        visibility = self._config.message_visibility_s if p.visibility_s is None \
            else p.visibility_s
        if not (0 < visibility <= VISIBILITY_MAX_S):  # also refuses NaN
            raise errors.BadRequest(f"visibility_s must be > 0 and <= {VISIBILITY_MAX_S:g}")
        _check_ids(p.ack)
        return await self._store.read_messages(p.reader, p.limit, visibility, p.ack_on_read,
                                               p.ack, self._config.max_frame_bytes)

    async def ack_messages(self, p: AckMessages) -> AckResult:
        """Mark the reader's deliveries processed (idempotent). Raises: BadRequest."""
        check_name("reader", p.reader)
        _check_ids(p.message_ids)
        return AckResult(acked=await self._store.ack_messages(p.reader, p.message_ids))

    async def update_agent_status(self, p: AgentStatusUpdate) -> AgentView:
        """Record an agent's status and heartbeat; return the stored view. Raises: BadRequest,
        PayloadTooLarge."""
        check_name("name", p.name)
        check_name("status", p.status, STATUS_MAX_CHARS)
        cap = min(AGENT_METADATA_MAX_BYTES, self._cap())
        metadata = None if p.metadata is None else values.encode("metadata", p.metadata, cap)
        await self._store.update_agent(p.name, p.status, metadata)
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
        rows = await self._store.agents(p.name, p.after, p.limit, self._config.agent_stale_s)
        if p.name is not None and not rows:
            raise errors.NotFound(f"agent {p.name} has never reported a status")
        budget, size = self._config.max_frame_bytes // 2, 0
        agents: list[AgentView] = []
        for view in rows:
            size += len(_msgpack(view))
            if agents and size > budget:
                break
            agents.append(view)
        more = len(agents) < len(rows) or len(rows) == p.limit
        return AgentsResult(agents=agents,
                            next_after=agents[-1].name if more and p.name is None else None)

    async def purge_agents(self, now: float | None = None) -> int:
        """Forget agents whose last status is older than `message_retention_s` (the
        store's clock unless `now` is given); return how many."""
        retention = self._config.message_retention_s
        total = 0
        while True:
            n = await self._store.purge_agents(retention, now=now)
            total += n
            if n < msg_store.PURGE_BATCH:
                return total

    async def purge(self, now: float | None = None) -> int:
        """Delete expired messages, and processed messages and broadcasts past
        `message_retention_s` (the store's clock unless `now` is given); return how many."""
        retention = self._config.message_retention_s
        total = 0
        while True:
            n = await self._store.purge_messages(retention, now=now)
            total += n
            if n == 0:
                return total


def _check_ids(ids: list[str]) -> None:
    if len(ids) > ACK_IDS_MAX:
        raise errors.BadRequest(f"at most {ACK_IDS_MAX} message ids per ack, got {len(ids)}")
    for mid in ids:
        check_name("message id", mid)
