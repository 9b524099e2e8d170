"""Dispatch and the error -> wire-code mapping: the only place errors become replies.

Frame: 4-byte big-endian length, then that many bytes of msgpack (coordd.net.frames). A
length over the cap is answered with `payload_too_large` and the connection is closed
without reading the body (the daemon never buffers an oversize frame). A body that is not a
request envelope (`{id, method, params}`), or one nested too deep to decode, gets one
`bad_request` reply and the connection is closed, since the peer is not speaking our
protocol. Inside a valid envelope, bad params or an unknown method get an error reply and
the connection stays open.

Replies are capped like requests: a reply over the cap becomes a `payload_too_large`
error for that id, so a client never has to drop a frame it cannot take. Each peer is a
`Connection` (coordd.net.connection: frames in, back-pressure, replies out); the
`Dispatcher` here serves its requests, one task each (or none: `at_once`), and holds
what all connections share: the handler, the budgets' totals, the sweeper. At shutdown,
`stop_intake()` answers new requests `overloaded` ("shutting down"), `drain()` lets the
ones in flight finish, and `close_connections()` closes every peer.

Budgets (`Limits`, issue 21): coordd.net.budgets.
Connection-closed hook: `Connection.on_close` callbacks run once in `connection_lost`.
A connection's parked calls (coordd.service.push: a claim with `wait_s`, `wait_job`, ...) count
against its cap and are answered at its EOF.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from coordd import errors
from coordd.net import memory
from coordd.clock import Clock, SystemClock
from coordd.conffile import locate
from coordd.wire.protocol import ADMIN_METHODS, PARAMS, Request
from coordd.net.peercred import PeerCred
from coordd.net.budgets import (  # noqa: F401  (re-exported)
    REPLY_CONN, SMALL_FRAME_BYTES, Budgets, Limits,
)
from coordd.net.connection import (  # noqa: F401  (re-exported: tests)
    FLUSH_TIMEOUT_S, INFLIGHT_PER_CONNECTION, READ_AHEAD_BYTES, REFUSAL_LINGER_S, Connection,
    PeerOf,
)
from coordd.net.frames import (  # noqa: F401  (re-exported: client, listener, tests)
    HEADER, FrameTooLarge, encode_frame, read_frame,
)

logger = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 1.0

_param_decoders = {m: msgspec.msgpack.Decoder(t) for m, t in PARAMS.items()}
# each method's (params decoder, admin only), looked up once per request
_ROUTES = {m: (dec, m in ADMIN_METHODS) for m, dec in _param_decoders.items()}
_REFUSED_CODES = frozenset({"bad_request", "unknown_method", "permission_denied",
                            "payload_too_large"})

Handler = Callable[[str, Any], Awaitable[Any]]


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
        self._tasks: dict[int, asyncio.Task[None]] = {}  # in flight, by id() of their Request
        self._conns: set[Connection] = set()
        self._all_closed: asyncio.Future[None] | None = None
        self._closing = False
        self.inbound_bytes = 0   # reserved by partial frames over SMALL_FRAME_BYTES
        self.outbound_bytes = 0  # unsent reply bytes of connections over the high-water mark
        self.reply_reserved = 0  # reserved by replies being built (budgets.reserve_reply)
        self.large_bytes = 0     # large frames and replies handled since the last trim
        self.at_once: dict[str, Callable[[Any], Any]] = {}
        """Per method, an answer without a task: `f(params)` -> the result, or None when
        the request needs the handler (e.g. a heartbeat that is not quiet). It must not
        await, park or reserve reply bytes; it runs outside the request's context."""

    def accept(self, peer_of: PeerOf | None = None) -> Connection:
        """Make the Protocol for one new connection (the server's protocol factory);
        `peer_of(transport)` says who a TCP peer is (coordd.net.tls), else SO_PEERCRED."""
        return Connection(self, peer_of)

    async def _one(self, req: Request, conn: Connection) -> None:
        """Answer one request on `conn` (a task of its own, in a copy of the connection's
        context: its park scope and reply connection; replies go out in any order)."""
        method = req.method
        try:
            result = await self._handler(method, self._checked(req, conn.peer))
        except Exception as exc:
            self._failed(req, conn, exc)
        else:
            conn.send_result(req.id, result, method)
        finally:  # the request's bookkeeping, here rather than in a done callback
            if conn._reply_reserved:
                conn._release_reply()
            self._tasks.pop(id(req), None)
            conn._done()

    def _checked(self, req: Request, peer: PeerCred) -> Any:
        """`req`'s params, decoded, once its peer may call its method as the worker it names.

        Raises: UnknownMethod, PermissionDenied, BadRequest."""
        method = req.method
        route = _ROUTES.get(method)
        if route is None:
            raise errors.UnknownMethod(f"unknown method {method!r}")
        if peer.methods is not None and method not in peer.methods:
            raise errors.PermissionDenied(
                f"{method} is not served here (only {', '.join(sorted(peer.methods))})")
        if route[1] and not self._is_admin(peer):
            raise errors.PermissionDenied(
                f"{method} is an admin method; {peer!r} is not in the admin set")
        try:
            params = route[0].decode(req.params)
        except msgspec.DecodeError as exc:
            raise errors.BadRequest(f"{method}: {_located(exc, req.params)}") from exc
        except RecursionError as exc:
            raise errors.BadRequest(f"{method}: params nested too deep") from exc
        if peer.worker_id is not None and getattr(params, "worker_id", None) not in (
                None, peer.worker_id):  # a TLS peer acts only as its certificate's id
            raise errors.PermissionDenied(
                f"{method}: this connection's certificate is worker {peer.worker_id};"
                f" it may not act as worker {params.worker_id}")  # type: ignore[attr-defined]
        return params

    def _failed(self, req: Request, conn: Connection, exc: Exception) -> None:
        """Reply to `req` with `exc`: its code, or `internal` (logged) for a non-CoordError."""
        if isinstance(exc, errors.CoordError):
            if exc.code in _REFUSED_CODES:
                logger.info("refused %s from uid %s: %s: %s", req.method, conn.peer.uid,
                            exc.code, exc.message, extra={"action": "refused", "code": exc.code})
            conn.send_error(req.id, exc)
            return
        logger.exception("internal error in %s", req.method, extra={"action": "internal"})
        conn.send_error(req.id, errors.CoordError(f"internal error: {type(exc).__name__}"))

    def _answered_now(self, req: Request, conn: Connection) -> bool:
        """Answer `req` at once through `at_once[req.method]` (no task); False when that
        said None (not answerable now: the request goes on as a task)."""
        try:
            result = self.at_once[req.method](self._checked(req, conn.peer))
            if result is None:
                return False
        except Exception as exc:
            self._failed(req, conn, exc)
        else:
            conn.send_result(req.id, result, req.method)
        return True

    def connections(self) -> list[Connection]:
        """The open connections (a copy)."""
        return list(self._conns)

    def peers(self) -> int:
        """How many requests may reach the store together: the open connections, or the
        requests in flight if more (one connection may have many: a client that gathers
        its calls)."""
        return max(len(self._conns), len(self._tasks))

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
        """Wait up to `timeout` seconds for in-flight requests to finish, then cancel the rest
        (one cancelled before it began leaves its connection's count: close_connections
        closes it regardless)."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks.values()), timeout=timeout)
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
