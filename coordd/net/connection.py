"""One peer of the RPC layer (coordd.net.rpc): an asyncio.Protocol that cuts frames out of
its own buffer, starts each request as a task of the Dispatcher's, and writes the replies.

Back-pressure: a connection starts no new request while its transport's write buffer is
over the high-water mark (`pause_writing`) or while it has INFLIGHT_PER_CONNECTION
requests in flight or a reply waiting for its byte budget (coordd.net.budgets), and stops
reading once READ_AHEAD_BYTES wait unparsed, so a peer that does not read stalls only its
own connection. A connection that reaches EOF gets the replies to its requests in flight
before it is closed (the flush is cut off after FLUSH_TIMEOUT_S).

The per-request path is kept short: each request's task runs in a copy of the
connection's own context (its park scope and reply connection set once, at the start),
and its bookkeeping is done in its last step (no done callback). A method with an answer
in `Dispatcher.at_once` (a quiet heartbeat) is answered inside `data_received`, no task.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, cast

import msgspec

from coordd import errors
from coordd.net.budgets import REPLY_CONN, SMALL_FRAME_BYTES, Budgets, Ledger
from coordd.net.frames import HEADER, FrameTooLarge, encode_frame
from coordd.net.parking import PARK_SCOPE, ParkScope
from coordd.net.peercred import PeerCred
from coordd.wire.protocol import ErrorBody, Reply, Request

logger = logging.getLogger("coordd.net.rpc")

INFLIGHT_PER_CONNECTION = 64
FLUSH_TIMEOUT_S = 5.0
REFUSAL_LINGER_S = 1.0  # a refused TLS peer's requests read this long, answered with why
READ_AHEAD_BYTES = 64 * 1024  # unparsed bytes read on from a peer whose requests wait

_decode_request = msgspec.msgpack.Decoder(Request).decode
_encode = msgspec.msgpack.Encoder().encode

PeerOf = Callable[[asyncio.BaseTransport], PeerCred]


class Host(Ledger, Protocol):
    """What a connection uses of the coordd.net.rpc.Dispatcher that accepted it."""

    _max_frame: int
    _closing: bool
    _tasks: dict[int, asyncio.Task[None]]
    _conns: set["Connection"]
    at_once: dict[str, Callable[[Any], Any]]

    def _mono(self) -> float: ...
    def _one(self, req: Request, conn: "Connection") -> Coroutine[Any, Any, None]: ...
    def _answered_now(self, req: Request, conn: "Connection") -> bool: ...
    def _closed(self, conn: "Connection") -> None: ...


def _enter(conn: "Connection") -> None:
    PARK_SCOPE.set(conn.scope)  # its requests' parked calls are the connection's
    REPLY_CONN.set(conn)  # and their reply reservations (coordd.net.budgets)


class Connection(Budgets, asyncio.Protocol):
    """One peer: cut frames out of the received bytes, run each request as a task, reply.

    While the write buffer is over its high-water mark (`pause_writing`) or
    INFLIGHT_PER_CONNECTION requests are in flight, no new request is started: what arrives
    waits in the buffer, and reading pauses once READ_AHEAD_BYTES wait; both resume when
    the block lifts. After EOF (and the whole frames before it), a refused frame or
    `close()`, nothing more is read; the connection closes once its requests in flight
    have replied and the replies are flushed, or FLUSH_TIMEOUT_S after that began.
    """

    peer: PeerCred
    _transport: asyncio.Transport

    def __init__(self, dispatcher: Host, peer_of: PeerOf | None = None) -> None:
        self._d = dispatcher
        self._peer_of = peer_of
        self._loop = asyncio.get_running_loop()
        self._buf = bytearray()  # bytes received that are not yet a whole frame (or wait)
        self._need = 0           # len(_buf) that makes the next frame whole
        self._inflight = 0
        self._write_paused = False
        self._reading = True
        self._eof = False
        self._finishing = False  # no more requests: EOF, refused frame, close()
        self._abort_timer: asyncio.TimerHandle | None = None
        self._partial_since: float | None = None  # monotonic: when the arriving frame began
        self._reserved = 0         # of the dispatcher's inbound budget, for that frame
        self._unsent = 0           # counted in the dispatcher's outbound bytes
        self._stall_since = 0.0    # monotonic: since when no unsent byte was taken
        self._stall_size = 0
        self.on_close: list[Callable[[], None]] = []  # run once when the connection is lost
        self.scope = ParkScope()  # its parked calls (coordd.service.push): dropped when it closes
        self._reply_waiters = collections.deque()  # reservations waiting (coordd.net.budgets)
        self._refusal: errors.PermissionDenied | None = None  # a refused TLS peer's reason
        self._refusal_timer: asyncio.TimerHandle | None = None
        self._tls = False
        self._ctx = contextvars.copy_context()  # each request's task runs in a copy of it
        self._ctx.run(_enter, self)

    # -------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self._d._conns.add(self)
        if self._peer_of is None:
            self.peer = PeerCred.of(transport.get_extra_info("socket"))
            return
        self._tls = transport.get_extra_info("sslcontext") is not None
        try:
            self.peer = self._peer_of(transport)
        except errors.PermissionDenied as exc:  # a TLS peer without a usable identity
            # (logged by peer_of): say why at once (id 0) and to each request read within
            # REFUSAL_LINGER_S (its id), then close: the peer reads why, not a reset
            self.peer = PeerCred(0, -1, -1)
            self._refusal = exc
            self.send_error(None, exc)
            self._refusal_timer = self._loop.call_later(REFUSAL_LINGER_S, self._finish)

    def data_received(self, data: bytes) -> None:
        if self._finishing:
            return
        if (self._buf or self._write_paused or self._inflight >= INFLIGHT_PER_CONNECTION
                or self._reply_waiters):  # _blocked(), inline: once per read
            self._buf += data
            if self._blocked():
                if len(self._buf) >= READ_AHEAD_BYTES:
                    self._pause_reading()
                return
            if len(self._buf) < self._need:
                return
            data = bytes(self._buf)
            self._buf.clear()
            self._release_inbound()
        self._feed(data)

    def eof_received(self) -> bool:
        self._eof = True
        self.scope.close()  # its parked calls answer now (a closed peer reads as EOF)
        if not self._finishing and not (self._blocked() and self._frame_waiting()):
            self._end_of_input()
        # keep the transport open to send the replies still owed; TLS cannot (asyncio
        # closes it and warns if asked to)
        return not self._tls

    def pause_writing(self) -> None:
        self._write_paused = True
        self._stall_since = self._d._mono()
        self._stall_size = self._count_unsent()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._d.outbound_bytes -= self._unsent
        self._unsent = 0
        if self._reply_waiters:
            self._grant_replies()  # reads on once none waits
        self._unblock()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and not self._finishing:
            logger.info("peer uid %s went away mid-frame: %s", self.peer.uid, exc,
                        extra={"action": "truncated_frame", "uid": self.peer.uid})
        self._finishing = True
        self._buf.clear()
        self._release_inbound()
        self._d.outbound_bytes -= self._unsent
        self._d.large_bytes += self._unsent  # freed with the transport: worth a trim
        self._unsent = 0
        for timer in (self._abort_timer, self._refusal_timer):
            if timer is not None:
                timer.cancel()
        self.scope.close()
        self._fail_reply_waiters()
        self._d._closed(self)
        hooks, self.on_close = self.on_close, []
        for hook in hooks:
            try:
                hook()
            except Exception:
                logger.exception("connection-closed hook failed", extra={"action": "internal"})

    # -------------------------------------------------------------- frames in

    def _blocked(self) -> bool:
        return (self._write_paused or self._inflight >= INFLIGHT_PER_CONNECTION
                or bool(self._reply_waiters))  # a reply waits for this peer's budget

    def _frame_waiting(self) -> bool:
        """A whole frame (or an over-cap header) waits in `_buf`."""
        if len(self._buf) < HEADER.size:
            return False
        (length,) = HEADER.unpack_from(self._buf)
        return length > self._d._max_frame or len(self._buf) >= HEADER.size + length

    def _feed(self, data: bytes) -> None:
        """Serve every whole frame in `data`; keep the rest in `_buf`."""
        end = len(data)
        pos = 0
        max_frame = self._d._max_frame
        while end - pos >= HEADER.size:
            if (self._write_paused or self._inflight >= INFLIGHT_PER_CONNECTION
                    or self._reply_waiters):  # _blocked(), inline; the rest waits in _buf,
                # read on only up to READ_AHEAD_BYTES
                self._need = 0
                if end - pos >= READ_AHEAD_BYTES:
                    self._pause_reading()
                break
            (length,) = HEADER.unpack_from(data, pos)
            if length > max_frame:
                exc = FrameTooLarge(f"frame of {length} bytes is over the {max_frame}-byte cap")
                logger.warning("refused frame from uid %s: %s; closing", self.peer.uid, exc,
                               extra={"action": "frame_too_large", "uid": self.peer.uid})
                self.send_error(None, exc)
                self._finish()
                return
            stop = pos + HEADER.size + length
            if stop > end:
                self._need = stop - pos
                if length > SMALL_FRAME_BYTES and not self._reserve_inbound(length):
                    return
                break
            self._request(data[pos + HEADER.size:stop])
            if self._finishing:
                return
            pos = stop
        else:
            self._need = HEADER.size
        if pos < end:
            self._buf += memoryview(data)[pos:]
            if pos or self._partial_since is None:
                self._partial_since = self._d._mono()  # a new frame's deadline starts
        elif self._partial_since is not None:
            self._partial_since = None

    def _request(self, body: bytes) -> None:
        try:
            req = _decode_request(body)
        except (msgspec.DecodeError, RecursionError) as exc:
            why = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
            logger.warning("refused frame from uid %s: not a request envelope: %s; closing",
                           self.peer.uid, why, extra={"action": "bad_frame", "uid": self.peer.uid})
            self.send_error(None, errors.BadRequest(
                f"not a request envelope {{id, method, params}}: {why}"))
            self._finish()
            return
        if self._refusal is not None:  # a refused TLS peer: no request is served
            self.send_error(req.id, self._refusal)
            self._finish()
            return
        if self._d._closing:
            self.send_error(req.id, errors.Overloaded("coordd is shutting down"))
            return
        if req.method in self._d.at_once and self._d._answered_now(req, self):
            return  # e.g. a quiet heartbeat: answered from memory, no task
        task = self._loop.create_task(self._d._one(req, self), context=self._ctx.copy())
        self._inflight += 1
        self._d._tasks[id(req)] = task  # Dispatcher._one ends with self._done()

    def _done(self) -> None:
        """A request's last step: it has replied; serve what waited for it, or close."""
        self._inflight -= 1
        if self._finishing:
            if not self._inflight:
                self._close_transport()
        elif self._buf or self._eof or not self._reading:
            self._unblock()

    def _pause_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._transport.pause_reading()

    def _unblock(self) -> None:
        """Serve the frames held back while blocked; after EOF end the input, else read
        again if reading was paused."""
        if self._finishing or self._blocked():
            return
        if self._buf and len(self._buf) >= self._need:
            data = bytes(self._buf)
            self._buf.clear()
            self._release_inbound()
            self._feed(data)
            if self._finishing or self._blocked():
                return
        if self._eof:
            self._end_of_input()
        elif not self._reading:
            self._reading = True
            self._transport.resume_reading()

    def _end_of_input(self) -> None:
        """EOF and every whole frame served: what is left in `_buf` is a torn frame."""
        if self._buf:
            logger.info("peer uid %s went away mid-frame: %d byte(s) of a frame unread",
                        self.peer.uid, len(self._buf),
                        extra={"action": "truncated_frame", "uid": self.peer.uid})
        self._finish()

    # -------------------------------------------------------------- replies out

    def send_result(self, req_id: int, result: Any, method: str) -> None:
        """Write the reply `{id, result}`; over the frame cap or unencodable it becomes a
        `payload_too_large` / `internal` error for that id."""
        if self._transport.is_closing():
            return
        try:
            body = _encode(Reply(id=req_id, result=result if result is not None else {}))
            if len(body) > self._d._max_frame:
                raise FrameTooLarge(f"reply of {len(body)} bytes is over the "
                                    f"{self._d._max_frame}-byte frame cap")
            frame = HEADER.pack(len(body)) + body
        except FrameTooLarge as exc:
            logger.warning("reply to %s: %s", method, exc, extra={"action": "reply_too_large"})
            frame = encode_frame(Reply(id=req_id, error=ErrorBody(
                code=exc.code, message=f"{exc.message}; ask for less (e.g. a smaller limit)")))
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
            logger.exception("cannot encode the reply to %s", method,
                             extra={"action": "internal"})
            frame = encode_frame(Reply(id=req_id, error=ErrorBody(
                code="internal", message=f"internal error: reply not encodable: {exc}")))
        if self._write_paused or len(frame) > SMALL_FRAME_BYTES:
            self._write_budgeted(req_id, frame, method)
        else:
            self._transport.write(frame)

    def send_error(self, req_id: int | None, error: errors.CoordError) -> None:
        """Write the reply `{id, error: {code, message}}` (id 0 when the request had none)."""
        if self._transport.is_closing():
            return
        self._transport.write(encode_frame(Reply(
            id=req_id or 0, error=ErrorBody(code=error.code, message=error.message))))

    # -------------------------------------------------------------- closing

    def _finish(self) -> None:
        """Take no more requests; close once the ones in flight have replied."""
        self._finishing = True
        self._buf.clear()
        self._release_inbound()
        self._pause_reading()
        if not self._inflight:
            self._close_transport()

    def _close_transport(self) -> None:
        transport = self._transport
        if transport.is_closing():
            return
        transport.close()  # flushes the write buffer first
        if transport.get_write_buffer_size() and self._abort_timer is None:
            self._abort_timer = self._loop.call_later(FLUSH_TIMEOUT_S, transport.abort)

    def close(self) -> None:
        """Stop reading and close: replies already written are flushed (FLUSH_TIMEOUT_S)."""
        self._finishing = True
        self._buf.clear()
        self._release_inbound()
        self._close_transport()

    def abort(self) -> None:
        """Close at once, dropping unsent replies."""
        self._transport.abort()
