"""Framing, dispatch and the error -> wire-code mapping. The only place errors become replies.

Frame: 4-byte big-endian length, then that many bytes of msgpack. A length over the cap
is answered with `payload_too_large` and the connection is closed without reading the
body (the daemon never buffers an oversize frame). A body that is not a request envelope
(`{id, method, params}`), or one nested too deep to decode, gets one `bad_request` reply
and the connection is closed, since the peer is not speaking our protocol. Inside a valid
envelope, bad params or an unknown method get an error reply and the connection stays open.

Replies are capped like requests: a reply over the cap becomes a `payload_too_large`
error for that id, so a client never has to drop a frame it cannot take. Each connection
is an asyncio.Protocol (`Connection`) that cuts frames out of its own buffer, so a request
costs one task and no stream machinery. Back-pressure: a connection starts no new
request while its transport's write buffer is over the high-water mark (`pause_writing`)
or while it has INFLIGHT_PER_CONNECTION requests in flight or a reply waiting for its
byte budget (coordd.net.budgets.reserve_reply), and stops reading once
READ_AHEAD_BYTES wait unparsed, so a peer that does not read stalls only its own
connection and coordd holds at most that many replies and bytes for it. A connection that
reaches EOF gets the replies to its requests in flight before it is closed (the flush is
cut off after FLUSH_TIMEOUT_S). At shutdown, `stop_intake()` answers new requests
`overloaded` ("shutting down"), `drain()` lets the ones in flight finish, and
`close_connections()` closes every peer.

Budgets (`Limits`, issue 21): coordd.net.budgets.
Connection-closed hook: `Connection.on_close` callbacks run once in `connection_lost`.
A connection's parked calls (coordd.service.push: a claim with `wait_s`, `wait_job`, ...) count
against its cap and are answered at its EOF.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

import msgspec

from coordd import errors
from coordd.net import memory
from coordd.clock import Clock, SystemClock
from coordd.conffile import locate
from coordd.wire.protocol import ADMIN_METHODS, PARAMS, ErrorBody, Reply, Request
from coordd.net.peercred import PeerCred  # noqa: F401  (re-exported: server, tests)
from coordd.net.parking import PARK_SCOPE, ParkScope
from coordd.net.budgets import (  # noqa: F401  (re-exported)
    REPLY_CONN, SMALL_FRAME_BYTES, Budgets, Limits,
)
from coordd.net.frames import (  # noqa: F401  (re-exported: client, listener, tests)
    HEADER, FrameTooLarge, encode_frame, read_frame,
)

logger = logging.getLogger(__name__)

INFLIGHT_PER_CONNECTION = 64
FLUSH_TIMEOUT_S = 5.0
REFUSAL_LINGER_S = 1.0  # a refused TLS peer's requests read this long, answered with why
READ_AHEAD_BYTES = 64 * 1024  # unparsed bytes read on from a peer whose requests wait
SWEEP_INTERVAL_S = 1.0


_decode_request = msgspec.msgpack.Decoder(Request).decode
_param_decoders = {m: msgspec.msgpack.Decoder(t) for m, t in PARAMS.items()}

Handler = Callable[[str, Any], Awaitable[Any]]
PeerOf = Callable[[asyncio.BaseTransport], PeerCred]


def _located(exc: msgspec.DecodeError, params: Any) -> str:
    """A params error with msgspec's `$.nodes[1]` / `$.x[...]` said by name (coordd.conffile)."""
    try:
        return locate(str(exc), msgspec.msgpack.decode(params))
    except (msgspec.DecodeError, RecursionError, TypeError):
        return str(exc)


class Dispatcher:
    """Serve connections: decode requests, check permissions, call the handler, reply.

    Serve it with `loop.create_unix_server(dispatcher.accept, sock=sock)`.

    Args:
        handler: `await handler(method, params_struct)` -> a result (Struct, dict, ...).
        max_frame: frame cap in bytes, for requests and replies.
        is_admin: `is_admin(peer)` for methods in protocol.ADMIN_METHODS.
    """

    def __init__(self, handler: Handler, max_frame: int,
                 is_admin: Callable[[PeerCred], bool], limits: Limits | None = None,
                 clock: Clock | None = None) -> None:
        self._handler = handler
        self._max_frame = max_frame
        self._is_admin = is_admin
        self.limits = limits or Limits()
        self._mono = (clock or SystemClock()).mono
        self._tasks: set[asyncio.Task[None]] = set()
        self._conns: set[Connection] = set()
        self._all_closed: asyncio.Future[None] | None = None
        self._closing = False
        self.inbound_bytes = 0   # reserved by partial frames over SMALL_FRAME_BYTES
        self.outbound_bytes = 0  # unsent reply bytes of connections over the high-water mark
        self.reply_reserved = 0  # reserved by replies being built (budgets.reserve_reply)
        self.large_bytes = 0     # large frames and replies handled since the last trim

    def accept(self, peer_of: PeerOf | None = None) -> Connection:
        """Make the Protocol for one new connection (the server's protocol factory);
        `peer_of(transport)` says who a TCP peer is (coordd.net.tls), else SO_PEERCRED."""
        return Connection(self, peer_of)

    async def _one(self, req: Request, conn: Connection) -> None:
        """Answer one request on `conn` (a task of its own; replies go out in any order)."""
        peer = conn.peer
        PARK_SCOPE.set(conn.scope)  # this task's own context: its parked calls are conn's
        REPLY_CONN.set(conn)  # and its reply reservations (budgets.reserve_reply)
        try:
            decoder = _param_decoders.get(req.method)
            if decoder is None:
                raise errors.UnknownMethod(f"unknown method {req.method!r}")
            if peer.methods is not None and req.method not in peer.methods:
                raise errors.PermissionDenied(
                    f"{req.method} is not served here (only {', '.join(sorted(peer.methods))})")
            if req.method in ADMIN_METHODS and not self._is_admin(peer):
                raise errors.PermissionDenied(
                    f"{req.method} is an admin method; {peer!r} is not in the admin set")
            try:
                params = decoder.decode(req.params)
            except msgspec.DecodeError as exc:
                raise errors.BadRequest(f"{req.method}: {_located(exc, req.params)}") from exc
            except RecursionError as exc:
                raise errors.BadRequest(f"{req.method}: params nested too deep") from exc
            if peer.worker_id is not None and getattr(params, "worker_id", None) not in (
                    None, peer.worker_id):  # a TLS peer acts only as its certificate's id
                raise errors.PermissionDenied(
                    f"{req.method}: this connection's certificate is worker {peer.worker_id};"
                    f" it may not act as worker {params.worker_id}")  # type: ignore[attr-defined]
            result = await self._handler(req.method, params)
        except errors.CoordError as exc:
            if exc.code in ("bad_request", "unknown_method", "permission_denied",
                            "payload_too_large"):
                logger.info("refused %s from uid %s: %s: %s", req.method, peer.uid, exc.code,
                            exc.message, extra={"action": "refused", "code": exc.code})
            conn.send_error(req.id, exc)
        except Exception as exc:
            logger.exception("internal error in %s", req.method, extra={"action": "internal"})
            conn.send_error(req.id, errors.CoordError(f"internal error: {type(exc).__name__}"))
        else:
            conn.send_result(req.id, result, req.method)
        finally:
            if conn._reply_reserved:
                conn._release_reply()

    def connections(self) -> list[Connection]:
        """The open connections (a copy)."""
        return list(self._conns)

    def _closed(self, conn: Connection) -> None:
        self._conns.discard(conn)
        if not self._conns and self._all_closed is not None and not self._all_closed.done():
            self._all_closed.set_result(None)

    def sweep(self, now: float) -> int:
        """Close connections past a deadline (`now`: monotonic seconds): a frame not whole
        `frame_timeout_s` after its first byte, or unsent replies not read for
        `write_stall_timeout_s`. Returns how many were closed."""
        closed = 0
        for conn in list(self._conns):
            if conn.sweep(now):
                closed += 1
        return closed

    async def run_sweeper(self, stop: asyncio.Event, clock: Clock) -> None:
        """Call `sweep` every SWEEP_INTERVAL_S until `stop` is set; after a burst of large
        buffers (memory.TRIM_AFTER_BYTES), or once none is held any more after some, hand
        freed heap memory back (memory.trim)."""
        while not await clock.wait(stop, SWEEP_INTERVAL_S):
            self.sweep(clock.mono())
            if self.large_bytes >= memory.TRIM_AFTER_BYTES or self.large_bytes and not (
                    self.outbound_bytes or self.reply_reserved or self.inbound_bytes):
                self.large_bytes = 0
                await asyncio.to_thread(memory.trim)

    def stop_intake(self) -> None:
        """Answer every request read from now on with `overloaded` (shutting down)."""
        self._closing = True

    async def drain(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for in-flight requests to finish, then cancel the rest."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            for t in pending:
                t.cancel()
            if pending:
                logger.warning("cancelled %d request(s) still running after %.1fs",
                               len(pending), timeout, extra={"action": "drain_timeout"})
                await asyncio.wait(pending)

    async def close_connections(self, timeout: float) -> None:
        """Close every peer connection (replies already written are flushed) and wait up to
        `timeout` seconds for them to close; abort the ones still open then."""
        if not self._conns:
            return
        self._all_closed = asyncio.get_running_loop().create_future()
        for conn in list(self._conns):
            conn.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._all_closed), timeout)
        except asyncio.TimeoutError:
            for conn in list(self._conns):
                conn.abort()
            await asyncio.wait([self._all_closed], timeout=timeout)  # next loop iteration


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

    def __init__(self, dispatcher: Dispatcher, peer_of: PeerOf | None = None) -> None:
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
        if self._buf or self._blocked():
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
            if self._blocked():  # the rest waits in _buf; read on only up to READ_AHEAD
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
        task = self._loop.create_task(self._d._one(req, self))
        self._inflight += 1
        self._d._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._d._tasks.discard(task)
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
            frame = encode_frame(Reply(id=req_id, result=result if result is not None else {}),
                                 self._d._max_frame, "reply")
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
