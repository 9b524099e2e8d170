"""The RPC layer's byte and time budgets (issue 21): `Limits`, and the part of
`coordd.net.connection.Connection` that enforces them (`Budgets`, a mixin it inherits).

Budgets (`Limits`, issue 21): a frame must arrive whole within `frame_timeout_s` of its
first byte; a frame over SMALL_FRAME_BYTES reserves its announced length from a global
budget of buffered inbound bytes while it arrives, and past the budget it is refused
`overloaded` and the connection closed. Replies held unsent for a peer that does not read
are bounded per connection and in total (past either, a reply over SMALL_FRAME_BYTES
becomes an `overloaded` error for its id), and a peer that takes none of its unsent bytes
for `write_stall_timeout_s` is dropped. `Dispatcher.sweep(now)` enforces the two
deadlines; `Dispatcher.run_sweeper` calls it every SWEEP_INTERVAL_S.

A handler that may build a large reply reserves its size first (`reserve_reply(nbytes)`,
before it fetches anything): the rule not to break is that a reply's bytes are counted
against both budgets before they are spent, not when they are written. A reservation
that would pass the connection's budget waits (and the connection reads no new request
meanwhile) until the peer takes some of its replies; one that would pass the global
budget is refused `overloaded` at once. It is released once its reply is written.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
from dataclasses import dataclass
from typing import Protocol

from coordd import errors
from coordd.net.frames import encode_frame
from coordd.wire.protocol import ErrorBody, Reply

logger = logging.getLogger("coordd.net.rpc")

SMALL_FRAME_BYTES = 64 * 1024  # frames up to this size pass the byte budgets unchecked

# set in each request's task (coordd.net.connection): its connection, and the bytes it reserved
REPLY_CONN: contextvars.ContextVar["Budgets | None"] = contextvars.ContextVar(
    "coordd_reply_conn", default=None)
_RESERVED: contextvars.ContextVar[int] = contextvars.ContextVar("coordd_reply_reserved",
                                                                default=0)


def reply_budgeted() -> bool:
    """True when the running request's reply goes to a peer (an RPC connection), so a
    large one should be sized and reserved (`reserve_reply`) before it is built."""
    return REPLY_CONN.get() is not None


async def reserve_reply(nbytes: int) -> None:
    """Reserve `nbytes` (an estimate of the reply's size) of the outbound budgets of the
    running request's connection before the reply is built; released when it is written.
    A no-op for replies up to SMALL_FRAME_BYTES and outside an RPC request.

    Waits while the connection's unsent and reserved bytes would pass `max_unsent_bytes`
    (unless it holds none).

    Raises:
        errors.Overloaded: the global `max_outbound_bytes` would be passed.
        errors.CoordError: the connection closed while waiting.
    """
    conn = REPLY_CONN.get()
    if conn is None or nbytes <= SMALL_FRAME_BYTES:
        return
    await conn._reserve_reply(nbytes)
    _RESERVED.set(_RESERVED.get() + nbytes)


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


class Ledger(Protocol):
    """The totals a connection's budgets are kept against, all connections together
    (coordd.net.rpc.Dispatcher holds them). Bytes."""

    limits: Limits
    inbound_bytes: int   # reserved by partial frames over SMALL_FRAME_BYTES
    outbound_bytes: int  # unsent reply bytes of connections over the high-water mark
    reply_reserved: int  # reserved by replies being built (reserve_reply)
    large_bytes: int     # large frames and replies handled since the last trim


class Budgets:
    """The budget bookkeeping of one connection (mixed into coordd.net.connection.Connection, whose
    attributes and methods it uses)."""

    _d: Ledger
    _transport: "asyncio.Transport"
    _reply_reserved = 0  # bytes reserved by this connection's replies not yet written
    _reply_waiters: "collections.deque[tuple[int, asyncio.Future[None]]]"

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
            if self._reply_waiters:
                self._grant_replies()
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
        if len(frame) > SMALL_FRAME_BYTES and not _RESERVED.get() and (
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

    # ---------------------------------------------------------- reply reservations

    def _reply_fits(self, nbytes: int) -> bool:
        held = self._transport.get_write_buffer_size() + self._reply_reserved
        return not held or held + nbytes <= self._d.limits.max_unsent_bytes

    def _global_refusal(self, nbytes: int) -> errors.Overloaded | None:
        d = self._d
        held = d.outbound_bytes + d.reply_reserved
        if not held or held + nbytes <= d.limits.max_outbound_bytes:
            return None
        logger.warning("reply of ~%d bytes refused before it was built for uid %s: %d bytes "
                       "unsent or reserved in all", nbytes, self.peer.uid, held,
                       extra={"action": "outbound_budget"})
        return errors.Overloaded(
            f"reply of ~{nbytes} bytes refused: {held} bytes of replies wait unread or are "
            f"being built for all peers (max_outbound_bytes {d.limits.max_outbound_bytes}); "
            "retry later")

    def _take_reply(self, nbytes: int) -> None:
        self._reply_reserved += nbytes
        self._d.reply_reserved += nbytes

    async def _reserve_reply(self, nbytes: int) -> None:
        refusal = self._global_refusal(nbytes)
        if refusal is not None:
            raise refusal
        if self._finishing:
            raise errors.CoordError("the connection is closing")
        waiters = self._reply_waiters
        if not waiters and self._reply_fits(nbytes):
            self._take_reply(nbytes)
            return
        fut: asyncio.Future[None] = self._loop.create_future()
        waiters.append((nbytes, fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._release_reply(nbytes)  # granted as we were cancelled
            raise

    def _grant_replies(self) -> None:
        """Let waiting reservations in, oldest first, while they fit; read on when none
        waits any more."""
        waiters = self._reply_waiters
        while waiters:
            nbytes, fut = waiters[0]
            if not fut.done():
                if not self._reply_fits(nbytes):
                    return
                refusal = self._global_refusal(nbytes)
                if refusal is not None:
                    fut.set_exception(refusal)
                else:
                    self._take_reply(nbytes)
                    fut.set_result(None)
            waiters.popleft()
        self._unblock()

    def _release_reply(self, nbytes: int | None = None) -> None:
        """Give back `nbytes` (default: what the running request reserved) once its reply
        is written (or it failed), and let waiting reservations in."""
        if nbytes is None:
            nbytes = _RESERVED.get()
        nbytes = min(nbytes, self._reply_reserved)
        self._reply_reserved -= nbytes
        self._d.reply_reserved -= nbytes
        if self._reply_waiters:
            self._grant_replies()

    def _fail_reply_waiters(self) -> None:
        """The connection is gone: reservations still waiting end with an error."""
        waiters = self._reply_waiters
        while waiters:
            _nbytes, fut = waiters.popleft()
            if not fut.done():
                fut.set_exception(errors.CoordError("the connection closed"))
