"""The hub's pure rules, shared by both stores: a stored message as its view, the byte
budget of one read reply, an agent's row as its view. No I/O here."""

from __future__ import annotations

from typing import Any

import msgspec

from coordd import errors
from coordd.wire.protocol import AgentView, MessageView
from coordd.jsontext import lenient_json

READ_REPLY_BYTES_MAX = 4 << 20  # encoded messages per read reply (and <= half the frame cap)

encoded = msgspec.msgpack.Encoder().encode


def message_view(row: tuple[Any, ...]) -> MessageView:
    """A MessageView from (message_id, sender, recipient, message_type, content JSON,
    priority, metadata JSON, created_at, expires_at, deliveries)."""
    (mid, sender, recipient, mtype, content, prio, meta, created, expires, deliveries) = row
    return MessageView(message_id=mid, sender=sender, recipient=recipient, message_type=mtype,
                       content=lenient_json(content), priority=prio,
                       metadata=lenient_json(meta), created_at=created,
                       expires_at=expires, deliveries=deliveries)


class ReadBudget:
    """Which messages of an inbox one read reply carries: in inbox order, while their
    encoded views fit min(READ_REPLY_BYTES_MAX, half the frame cap); the first always.

    Args:
        frame_bytes: the frame cap (`max_frame_bytes`).
    """

    def __init__(self, frame_bytes: int) -> None:
        self._frame = frame_bytes
        self._budget = min(READ_REPLY_BYTES_MAX, frame_bytes // 2)
        self._size = 0
        self.views: list[MessageView] = []

    def take(self, row: tuple[Any, ...]) -> bool:
        """Count the message's encoded bytes (the whole view) against the budget; False:
        it does not fit, end the read here.

        Raises: errors.PayloadTooLarge (one message over half the frame cap: only one
            stored before the send-side cap; nothing is delivered).
        """
        view = message_view(row)
        n = len(encoded(view))
        if self.views and self._size + n > self._budget:
            return False
        if n > self._frame // 2:
            raise errors.PayloadTooLarge(
                f"message {view.message_id} is {n} bytes encoded, over half the "
                f"{self._frame}-byte frame cap; nothing was delivered")
        self._size += n
        self.views.append(view)
        return True


def agent_view(row: tuple[Any, ...], now: float, stale_s: float) -> AgentView:
    """An AgentView from (name, status, metadata JSON, heartbeat_at, first_seen_at, unread)
    at `now`; live = heard from within `stale_s`."""
    name, status, meta, hb, first, unread = row
    return AgentView(name=name, status=status, metadata=lenient_json(meta),
                     heartbeat_at=hb, heartbeat_age_s=max(0.0, now - hb),
                     live=now - hb <= stale_s, first_seen_at=first, unread=int(unread))
