"""Wire Structs of the agent message hub's methods (coordd.service.hub), registered in
coordd.wire.protocol's PARAMS (which re-exports them)."""

from __future__ import annotations

from typing import Any

import msgspec



class BroadcastMessage(msgspec.Struct, kw_only=True):
    """`broadcast`: one message every reader but the sender gets once. `content` and
    `metadata` are JSON.

    `message_id` (optional, chosen by the sender) makes a resend after a lost reply
    return the stored message instead of a second one. `ttl_s`: never delivered after.
    """

    sender: str
    content: Any = None
    message_type: str = "text"
    priority: int = 2
    metadata: dict[str, Any] | None = None
    ttl_s: float | None = None
    message_id: str | None = None


class SendMessage(BroadcastMessage, kw_only=True):
    """`send_message`: the fields of a broadcast, for one `recipient` only."""

    recipient: str


class ReadMessages(msgspec.Struct, kw_only=True):
    """`read_messages`: `reader`'s inbox, P0 first then oldest first.

    `ack` (ids of messages handled since the last read) is applied first, in the same
    transaction. Unacked messages come back after `visibility_s`; `ack_on_read` marks
    them processed at once instead (at most once).
    """

    reader: str
    limit: int = 10
    visibility_s: float | None = None
    ack: list[str] = []
    ack_on_read: bool = False


class AckMessages(msgspec.Struct, kw_only=True):
    """`ack_messages`: `reader` has handled these messages; they are not delivered again."""

    reader: str
    message_ids: list[str]


class AgentStatusUpdate(msgspec.Struct, kw_only=True):
    """`update_agent_status`: an agent's status and heartbeat (metadata None = keep)."""

    name: str
    status: str
    metadata: dict[str, Any] | None = None


class AgentQuery(msgspec.Struct, kw_only=True):
    """`get_agent_status`: one agent by name, or a page of agents by name (name None):
    up to `limit` (1..1000, default 100) after the name `after`."""

    name: str | None = None
    limit: int = 100
    after: str | None = None


class SendResult(msgspec.Struct, kw_only=True):
    """`send_message` / `broadcast` result: `created` False = the id was already stored."""

    message_id: str
    created: bool
    expires_at: float | None = None


class MessageView(msgspec.Struct, kw_only=True):
    """A delivered message; `deliveries` > 1 means it was handed out before and not acked."""

    message_id: str
    sender: str
    recipient: str | None  # None: a broadcast
    message_type: str
    content: Any
    priority: int
    metadata: dict[str, Any] | None
    created_at: float
    expires_at: float | None
    deliveries: int


class ReadResult(msgspec.Struct, kw_only=True):
    """`read_messages` result; unacked messages are hidden until `visible_until`."""

    messages: list[MessageView]
    acked: int = 0
    visible_until: float | None = None


class AckResult(msgspec.Struct, kw_only=True):
    """`ack_messages` result: deliveries newly marked processed."""

    acked: int


class AgentView(msgspec.Struct, kw_only=True):
    """An agent's last status; `live` = heartbeat within `agent_stale_s`."""

    name: str
    status: str
    metadata: dict[str, Any] | None
    heartbeat_at: float
    heartbeat_age_s: float
    live: bool
    first_seen_at: float
    unread: int


class AgentsResult(msgspec.Struct, kw_only=True):
    """`get_agent_status` result; `next_after` set: there may be more, ask with after=it."""

    agents: list[AgentView]
    next_after: str | None = None


HUB_PARAMS: dict[str, type[msgspec.Struct]] = {
    "send_message": SendMessage,
    "broadcast": BroadcastMessage,
    "read_messages": ReadMessages,
    "ack_messages": AckMessages,
    "update_agent_status": AgentStatusUpdate,
    "get_agent_status": AgentQuery,
}
