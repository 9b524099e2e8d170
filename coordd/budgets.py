"""The RPC layer's byte and time budgets (issue 21): `Limits`, and the part of
`coordd.rpc.Connection` that enforces them (`Budgets`, a mixin it inherits).

Budgets (`Limits`, issue 21): a frame must arrive whole within `frame_timeout_s` of its
first byte; a frame over SMALL_FRAME_BYTES reserves its announced length from a global
budget of buffered inbound bytes while it arrives, and past the budget it is refused
`overloaded` and the connection closed. Replies held unsent for a peer that does not read
are bounded per connection and in total (past either, a reply over SMALL_FRAME_BYTES
becomes an `overloaded` error for its id), and a peer that takes none of its unsent bytes
for `write_stall_timeout_s` is dropped. `Dispatcher.sweep(now)` enforces the two
deadlines; `Dispatcher.run_sweeper` calls it every SWEEP_INTERVAL_S.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordd import errors
from coordd.frames import encode_frame
from coordd.protocol import ErrorBody, Reply

if TYPE_CHECKING:
    import asyncio

    from coordd.rpc import Dispatcher

logger = logging.getLogger("coordd.rpc")

SMALL_FRAME_BYTES = 64 * 1024  # frames up to this size pass the byte budgets unchecked


@dataclass(frozen=True)
class Limits:
    """Per-connection and global budgets of the RPC layer. Bytes and seconds.

    Attributes:
        max_inbound_bytes: partial frames buffered, all connections together (each frame
            over SMALL_FRAME_BYTES counts its announced length while it arrives).
        frame_timeout_s: a frame must be whole this long after its first byte.
        max_unsent_bytes: reply bytes held unsent for one connection.
        max_outbound_bytes: reply bytes held unsent, all connections together.
        write_stall_timeout_s: a peer that takes none of its unsent bytes this long is
            dropped.
    """

    max_inbound_bytes: int = 256 << 20
    frame_timeout_s: float = 60.0
    max_unsent_bytes: int = 32 << 20
    max_outbound_bytes: int = 256 << 20
    write_stall_timeout_s: float = 30.0


class Budgets:
    """The budget bookkeeping of one connection (mixed into coordd.rpc.Connection, whose
    attributes and methods it uses)."""

    _d: "Dispatcher"
    _transport: "asyncio.Transport"

    def _count_unsent(self) -> int:
        """Bring this connection's share of the dispatcher's outbound bytes up to date."""
        size = self._transport.get_write_buffer_size()
        self._d.outbound_bytes += size - self._unsent
        self._unsent = size
        return size

    def _release_inbound(self) -> None:
        if self._reserved:
            self._d.inbound_bytes -= self._reserved
            self._reserved = 0

    def _reserve_inbound(self, length: int) -> bool:
        """Reserve a large frame's announced length; refuse it (and finish) past the budget."""
        d = self._d
        if d.inbound_bytes + length > d.limits.max_inbound_bytes:
            logger.warning("refused a %d-byte frame from uid %s: %d bytes of partial frames "
                           "buffered (max_inbound_bytes %d); closing", length, self.peer.uid,
                           d.inbound_bytes, d.limits.max_inbound_bytes,
                           extra={"action": "inbound_budget", "uid": self.peer.uid})
            self.send_error(None, errors.Overloaded(
                f"frame of {length} bytes refused: coordd's inbound budget is spent "
                f"({d.inbound_bytes} of max_inbound_bytes {d.limits.max_inbound_bytes} "
                "bytes buffered); retry later"))
            self._finish()
            return False
        d.inbound_bytes += length
        d.large_bytes += length
        self._reserved = length
        return True

    def sweep(self, now: float) -> bool:
        """Enforce the frame and write-stall deadlines at `now` (monotonic); True if closed."""
        if self._transport.is_closing():
            return False
        limits = self._d.limits
        if self._partial_since is not None and not self._finishing:
            if self._blocked():
                self._partial_since = now  # we are not reading: not the peer's delay
            elif now - self._partial_since > limits.frame_timeout_s:
                logger.warning("peer uid %s sent %d byte(s) of a frame in %.0fs "
                               "(frame_timeout_s %g); closing", self.peer.uid, len(self._buf),
                               now - self._partial_since, limits.frame_timeout_s,
                               extra={"action": "frame_timeout", "uid": self.peer.uid})
                self.send_error(None, errors.BadRequest(
                    f"frame not complete within frame_timeout_s {limits.frame_timeout_s:g}"))
                self._finish()
                return True
        if self._write_paused:
            size = self._count_unsent()
            if size < self._stall_size:
                self._stall_since, self._stall_size = now, size
            elif now - self._stall_since > limits.write_stall_timeout_s:
                logger.warning("peer uid %s read none of %d unsent reply byte(s) in %.0fs "
                               "(write_stall_timeout_s %g); dropping it", self.peer.uid, size,
                               now - self._stall_since, limits.write_stall_timeout_s,
                               extra={"action": "write_stall", "uid": self.peer.uid})
                self._finishing = True
                self._buf.clear()
                self._transport.abort()
                return True
        return False


    def _write_budgeted(self, req_id: int, frame: bytes, method: str) -> None:
        """Write a large reply, or one to a peer behind on reading, if the unsent budgets
        allow; otherwise answer `overloaded` for its id."""
        limits = self._d.limits
        unsent = self._count_unsent()
        self._d.large_bytes += len(frame)
        if len(frame) > SMALL_FRAME_BYTES and (
                (unsent and unsent + len(frame) > limits.max_unsent_bytes)
                or self._d.outbound_bytes + len(frame) > limits.max_outbound_bytes):
            logger.warning("reply to %s (%d bytes) not sent to uid %s: %d bytes unsent to "
                           "it, %d in all", method, len(frame), self.peer.uid, unsent,
                           self._d.outbound_bytes, extra={"action": "outbound_budget"})
            frame = encode_frame(Reply(id=req_id, error=ErrorBody(
                code="overloaded", message=(
                    f"reply of {len(frame)} bytes not sent: {unsent} bytes of replies wait "
                    f"unread on this connection (max_unsent_bytes {limits.max_unsent_bytes})"
                    f", {self._d.outbound_bytes} on all (max_outbound_bytes "
                    f"{limits.max_outbound_bytes}); read your replies, then ask again"))))
        self._transport.write(frame)
        if self._write_paused:
            self._count_unsent()

