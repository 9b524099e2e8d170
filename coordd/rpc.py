"""Framing, dispatch and the error -> wire-code mapping. The only place errors become replies.

Frame: 4-byte big-endian length, then that many bytes of msgpack. A length over the cap
is answered with `payload_too_large` and the connection is closed without reading the
body (the daemon never buffers an oversize frame). A body that is not a request envelope
(`{id, method, params}`), or one nested too deep to decode, gets one `bad_request` reply
and the connection is closed, since the peer is not speaking our protocol. Inside a valid
envelope, bad params or an unknown method get an error reply and the connection stays open.

Replies are capped like requests: a reply over the cap becomes a `payload_too_large`
error for that id, so a client never has to drop a frame it cannot take. Each reply is
written with back-pressure (`drain`): a peer that does not read stalls only its own
connection, and at most INFLIGHT_PER_CONNECTION requests per connection are held.
A connection that reaches EOF gets the replies to its requests in flight before it is
closed. At shutdown, `stop_intake()` answers new requests `overloaded` ("shutting down"),
`drain()` lets the ones in flight finish, and `close_connections()` closes every peer.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from coordd import errors
from coordd.protocol import ADMIN_METHODS, PARAMS, ErrorBody, Reply, Request

logger = logging.getLogger(__name__)

HEADER = struct.Struct(">I")
INFLIGHT_PER_CONNECTION = 64
FLUSH_TIMEOUT_S = 5.0

_decode_request = msgspec.msgpack.Decoder(Request).decode
_encoder = msgspec.msgpack.Encoder()
_param_decoders = {m: msgspec.msgpack.Decoder(t) for m, t in PARAMS.items()}

Handler = Callable[[str, Any], Awaitable[Any]]


class FrameTooLarge(errors.PayloadTooLarge):
    """A frame's length prefix is over the cap."""


def encode_frame(obj: Any, max_frame: int | None = None, what: str = "frame") -> bytes:
    """Encode `obj` as msgpack with its 4-byte big-endian length prefix.

    Raises:
        FrameTooLarge: `max_frame` is given and the body is over it.
    """
    body = _encoder.encode(obj)
    if max_frame is not None and len(body) > max_frame:
        raise FrameTooLarge(f"{what} of {len(body)} bytes is over the {max_frame}-byte frame cap")
    return HEADER.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader, max_frame: int) -> bytes | None:
    """Read one frame body; None on a clean EOF between frames.

    Raises:
        FrameTooLarge: the length prefix is over `max_frame` (the body is not read).
        asyncio.IncompleteReadError: the peer went away mid-frame.
    """
    try:
        head = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    (length,) = HEADER.unpack(head)
    if length > max_frame:
        raise FrameTooLarge(f"frame of {length} bytes is over the {max_frame}-byte cap")
    return await reader.readexactly(length)


class PeerCred:
    """The connecting process's pid/uid/gid, from SO_PEERCRED."""

    def __init__(self, pid: int, uid: int, gid: int) -> None:
        self.pid, self.uid, self.gid = pid, uid, gid

    @classmethod
    def of(cls, sock: socket.socket | None) -> "PeerCred":
        """Read SO_PEERCRED of a connected Unix socket (uid -1 when unavailable)."""
        if sock is None:
            return cls(0, -1, -1)
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return cls(*struct.unpack("3i", raw))


class Dispatcher:
    """Serve connections: decode requests, check permissions, call the handler, reply.

    Args:
        handler: `await handler(method, params_struct)` -> a result (Struct, dict, ...).
        max_frame: frame cap in bytes for requests.
        is_admin: `is_admin(peer)` for methods in protocol.ADMIN_METHODS.
    """

    def __init__(self, handler: Handler, max_frame: int,
                 is_admin: Callable[[PeerCred], bool]) -> None:
        self._handler = handler
        self._max_frame = max_frame
        self._is_admin = is_admin
        self._tasks: set[asyncio.Task[None]] = set()
        self._conns: dict[asyncio.StreamWriter, asyncio.Task[Any] | None] = {}
        self._closing = False

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Handle one connection until EOF, a protocol error, or cancellation."""
        peer = PeerCred.of(writer.get_extra_info("socket"))
        inflight = asyncio.Semaphore(INFLIGHT_PER_CONNECTION)
        mine: set[asyncio.Task[None]] = set()
        self._conns[writer] = asyncio.current_task()
        try:
            while True:
                try:
                    body = await read_frame(reader, self._max_frame)
                except FrameTooLarge as exc:
                    logger.warning("refused frame from uid %s: %s; closing", peer.uid, exc,
                                   extra={"action": "frame_too_large", "uid": peer.uid})
                    self._send(writer, None, exc)
                    break
                except (asyncio.IncompleteReadError, OSError) as exc:
                    logger.info("peer uid %s went away mid-frame: %s", peer.uid, exc,
                                extra={"action": "truncated_frame", "uid": peer.uid})
                    break
                if body is None:
                    break
                try:
                    req = _decode_request(body)
                except (msgspec.DecodeError, RecursionError) as exc:
                    why = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
                    logger.warning("refused frame from uid %s: not a request envelope: %s; "
                                   "closing", peer.uid, why,
                                   extra={"action": "bad_frame", "uid": peer.uid})
                    self._send(writer, None, errors.BadRequest(
                        f"not a request envelope {{id, method, params}}: {why}"))
                    break
                if not self._closing:
                    await inflight.acquire()
                if self._closing:  # checked again: acquire may have waited
                    self._send(writer, req.id, errors.Overloaded("coordd is shutting down"))
                    continue
                task = asyncio.create_task(self._one(req, peer, writer))
                self._tasks.add(task)
                mine.add(task)
                task.add_done_callback(
                    lambda t: (self._tasks.discard(t), mine.discard(t), inflight.release()))
            if mine:  # answer what this peer already asked before closing on it
                await asyncio.wait(set(mine))
            if not writer.is_closing():
                await asyncio.wait_for(writer.drain(), FLUSH_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            self._conns.pop(writer, None)
            writer.close()

    async def _one(self, req: Request, peer: PeerCred, writer: asyncio.StreamWriter) -> None:
        try:
            decoder = _param_decoders.get(req.method)
            if decoder is None:
                raise errors.UnknownMethod(f"unknown method {req.method!r}")
            if req.method in ADMIN_METHODS and not self._is_admin(peer):
                raise errors.PermissionDenied(
                    f"{req.method} is an admin method; uid {peer.uid} is not in the admin set")
            try:
                params = decoder.decode(req.params)
            except msgspec.DecodeError as exc:
                raise errors.BadRequest(f"{req.method}: {exc}") from exc
            except RecursionError as exc:
                raise errors.BadRequest(f"{req.method}: params nested too deep") from exc
            result = await self._handler(req.method, params)
        except errors.CoordError as exc:
            if exc.code in ("bad_request", "unknown_method", "permission_denied",
                            "payload_too_large"):
                logger.info("refused %s from uid %s: %s: %s", req.method, peer.uid, exc.code,
                            exc.message, extra={"action": "refused", "code": exc.code})
            self._send(writer, req.id, exc)
        except Exception as exc:
            logger.exception("internal error in %s", req.method, extra={"action": "internal"})
            self._send(writer, req.id, errors.CoordError(f"internal error: {type(exc).__name__}"))
        else:
            self._send(writer, req.id, None, result, method=req.method)
        try:  # back-pressure: a peer that does not read stalls its own requests only
            await writer.drain()
        except OSError:
            pass

    def _send(self, writer: asyncio.StreamWriter, req_id: int | None,
              error: errors.CoordError | None, result: Any = None, method: str = "") -> None:
        if writer.is_closing():
            return
        if error is not None:
            reply = Reply(id=req_id or 0, error=ErrorBody(code=error.code, message=error.message))
            writer.write(encode_frame(reply))
            return
        try:
            frame = encode_frame(Reply(id=req_id or 0, result=result if result is not None else {}),
                                 self._max_frame, "reply")
        except FrameTooLarge as exc:
            logger.warning("reply to %s: %s", method, exc, extra={"action": "reply_too_large"})
            frame = encode_frame(Reply(id=req_id or 0, error=ErrorBody(
                code=exc.code, message=f"{exc.message}; ask for less (e.g. a smaller limit)")))
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
            logger.exception("cannot encode the reply to %s", method,
                             extra={"action": "internal"})
            frame = encode_frame(Reply(id=req_id or 0, error=ErrorBody(
                code="internal", message=f"internal error: reply not encodable: {exc}")))
        writer.write(frame)

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
        """Close every peer connection and wait (up to `timeout`) for their handlers to end."""
        tasks = [t for t in self._conns.values() if t is not None]
        for writer in list(self._conns):
            writer.close()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for t in pending:
                t.cancel()
