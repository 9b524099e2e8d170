"""One connection of the client library (coordd.client.Client) as an asyncio Protocol: it
cuts reply frames out of what arrives and resolves each call's future as its frame is
read, in the same loop step (no reading task between the socket and the call); and the
client's call timeouts (`Deadlines`: one loop timer for all calls in flight).

The rule not to break: whatever ends the connection (EOF, a reset, a frame over the cap,
bytes that are not a reply) fails every call still waiting on it, with the reason, once;
a reply that is a connection-level error (id 0) fails them all and is kept as the reason.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import msgspec

from coordd import errors
from coordd.net.frames import HEADER, FrameTooLarge
from coordd.wire.protocol import ReplyHeader

_decode_header = msgspec.msgpack.Decoder(ReplyHeader).decode
# the length prefix's size and reader, looked up once (an attribute of a struct.Struct is
# a slow lookup each time it is read)
_HEAD = HEADER.size
_length_at = HEADER.unpack_from
TIMER_SLACK_S = 0.001  # uvloop's clock and timers count whole milliseconds


class Deadlines:
    """The calls' timeouts under one loop timer, armed for the earliest deadline: a call
    adds its reply future once its request is written and discards it when it ends (no
    timer made and cancelled per call: docs/decisions.md, clientcost).

    The rule not to break: a future still here at its deadline fails with
    asyncio.TimeoutError, as a `call_later` of its own would have failed it.
    """

    def __init__(self) -> None:
        self._due: dict[asyncio.Future[Any], float] = {}  # future -> loop.time() deadline
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf  # when `_timer` fires
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of `_timer`

    def add(self, fut: asyncio.Future[Any], seconds: float) -> None:
        """Fail `fut` with asyncio.TimeoutError `seconds` from now, unless discarded."""
        loop = fut.get_loop()
        due = loop.time() + seconds
        self._due[fut] = due
        if loop is not self._loop:
            self._moved(loop)
        elif due < self._at:
            self._arm(loop, due)

    def discard(self, fut: asyncio.Future[Any]) -> None:
        """`fut`'s call ended: it has no deadline any more."""
        self._due.pop(fut, None)

    def stop(self) -> None:
        """Cancel the timer (the client closed); the next `add` arms it again."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._at, self._loop = None, math.inf, None

    def _moved(self, loop: asyncio.AbstractEventLoop) -> None:
        """The timer goes to `loop` (the first call, after a close, or a client used on
        another loop): futures of another loop are dropped (calls left behind on a loop
        that stopped, whose `finally` never ran: failing one would need its loop, and one
        that raises in `_fire` would stop the timer for the rest)."""
        self._due = {f: due for f, due in self._due.items() if f.get_loop() is loop}
        self._arm(loop, min(self._due.values()))

    def _arm(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        self.stop()
        self._timer, self._at, self._loop = loop.call_at(due, self._fire), due, loop

    def _fire(self) -> None:
        loop = self._loop
        assert loop is not None
        self._timer, self._at, self._loop = None, math.inf, None
        now = loop.time() + TIMER_SLACK_S
        for fut, due in list(self._due.items()):
            if due <= now:
                del self._due[fut]
                if not fut.done():
                    fut.set_exception(asyncio.TimeoutError())
        if self._due:
            self._arm(loop, min(self._due.values()))


class Wire(asyncio.Protocol):
    """Replies in for `client`, whose `_pending` futures it resolves; `transport` out.

    `lost`: the connection ended (reconnect). `paused`: the transport's write buffer is
    over its high-water mark (`drain` waits).
    """

    transport: asyncio.Transport

    def __init__(self, client: Any) -> None:  # a coordd.client.Client
        self._client = client
        self._buf = bytearray()
        self._need = 0  # bytes `_buf` must hold before the frame in it can be cut out
        self.paused = False
        self.lost = False
        self._drainers: list[asyncio.Future[None]] = []  # calls waiting in `drain`
        self._closed = asyncio.get_running_loop().create_future()
        self._ended: BaseException | None = None  # why we ended it (a bad frame)
        self.refusal: errors.CoordError | None = None  # a connection-level error reply
        self.answered = False  # a reply that is no refusal came

    # -------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._ended is not None:
            return
        if self._buf:
            self._buf += data
            if len(self._buf) < self._need:
                return  # the frame in progress is still short: no copy of it yet
            data = bytes(self._buf)
            self._buf.clear()
        end, pos, max_frame = len(data), 0, self._client.max_frame
        while end - pos >= _HEAD:
            (length,) = _length_at(data, pos)
            if length > max_frame:
                return self._end(FrameTooLarge(
                    f"frame of {length} bytes is over the {max_frame}-byte cap"))
            stop = pos + _HEAD + length
            if stop > end:
                break
            try:
                header = _decode_header(data[pos + _HEAD:stop])
            except msgspec.DecodeError as exc:
                return self._end(exc)
            self._reply(header)
            pos = stop
        if pos < end:
            self._buf += memoryview(data)[pos:]
            self._need = _HEAD + (_length_at(data, pos)[0] if end - pos >= _HEAD else 0)

    def eof_received(self) -> None:
        if self._buf and self._ended is None:  # the peer went away mid-frame
            (length,) = HEADER.unpack_from(self._buf) if len(self._buf) >= HEADER.size \
                else (0,)
            self._ended = asyncio.IncompleteReadError(bytes(self._buf),
                                                      HEADER.size + length)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake_drainers(lost=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._wake_drainers(lost=True)
        if not self._closed.done():
            self._closed.set_result(None)
        client = self._client
        if client._wire is not self:
            return  # closed by the client (its calls failed Closed) or replaced
        ended = self._ended or exc
        lost = client.disconnected(ended)
        why = None if self.refusal or self.answered else getattr(  # transport.Connector's
            client.connector, "closed_unanswered", lambda _exc: None)(ended)
        if why is not None:  # closed at once, nothing answered: coordd refused the certificate
            self.refusal = client._connection_error("permission_denied", why)
        client._fail_pending(self.refusal or lost)

    # -------------------------------------------------------------- the client's side

    def _reply(self, header: ReplyHeader) -> None:
        client = self._client
        if header.id == 0 and header.error is not None:
            # a connection-level error (oversize or garbage frame, out of file descriptors,
            # inbound budget spent, this peer refused): fail everyone
            self.refusal = client._connection_error(header.error.code, header.error.message)
            client._fail_pending(self.refusal)
            return
        if not self.answered and self.refusal is None:
            self.answered = True
            if (refusals := getattr(client.connector, "refusals", None)) is not None:
                refusals.answered()
        fut = client._pending.pop(header.id, None)
        if fut is not None and not fut.done():
            fut.set_result(header)

    def _wake_drainers(self, lost: bool) -> None:
        """Resume every call waiting in `drain` (`lost`: each raises ConnectionResetError)."""
        drainers, self._drainers = self._drainers, []
        for fut in drainers:
            if fut.done():
                continue  # its call was cancelled, or its reply future is done
            if not lost:
                fut.set_result(None)
            else:
                fut.set_exception(ConnectionResetError("Connection lost"))
                fut.exception()  # retrieved: the call that waits raises it

    def _end(self, exc: BaseException) -> None:
        """Stop reading: `exc` is why every waiting call fails (connection_lost says it)."""
        self._ended = exc
        self._buf.clear()
        self.transport.abort()

    def closing(self) -> bool:
        """True once the connection ended or is being closed: the next call reconnects."""
        return self.lost or self.transport.is_closing()

    async def drain(self, until: asyncio.Future[Any] | None = None) -> None:
        """Wait until the write buffer is under its high-water mark again, or `until` (a
        call's reply future: its timer, its reply, a close) is done.

        Raises: ConnectionResetError (the connection was lost)."""
        if self.lost:
            raise ConnectionResetError("Connection lost")
        if self.paused:  # each waiting call has its own future: one cancelled is one gone
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._drainers.append(fut)
            if until is not None:
                until.add_done_callback(lambda _u: fut.done() or fut.set_result(None))
            await fut

    async def wait_closed(self) -> None:
        """Return once the connection is closed (after `transport.close()`)."""
        await self._closed
