"""Accept connections on the listening socket, and refuse them explicitly when coordd is out
of file descriptors.

The rule not to break: a client that reaches the socket gets a connection or an error frame
that says why not, never a silent reset. A reserve descriptor is held for that: when
accept() fails with EMFILE/ENFILE it is closed, the waiting client is accepted on the
freed number, sent `overloaded` ("coordd is out of file descriptors") and closed, and the
reserve is opened again. The episode is logged once (coordd.net.fdlimit). On a TLS listener
(the TCP one) each accepted socket is tuned (keepalive, TCP_USER_TIMEOUT) and wrapped in
the context current at accept time; a refused client there is closed without a frame.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from collections.abc import Callable

from coordd.net import fdlimit
from coordd.wire.protocol import ErrorBody, Reply
from coordd.net.rpc import encode_frame

logger = logging.getLogger(__name__)

ACCEPTS_PER_WAKEUP = 64  # connections taken per readiness event before the loop moves on
RETRY_ACCEPT_S = 0.1     # with no reserve left, accepting pauses this long (no busy loop)
REFUSAL_LINGER_S = 0.05  # a refused client that sent nothing yet gets this long to send


class Listener:
    """Serve `sock` (a listening, bound socket) with `protocol_factory`, like
    `loop.create_unix_server(protocol_factory, sock=sock)`, with the out-of-fds refusal.

    Args:
        sock: the listening socket (closed by `close()`).
        protocol_factory: makes the asyncio.Protocol of one connection.
        tls: returns the SSLContext for a new connection (None: plaintext).
        tune: called on each accepted socket (e.g. coordd.net.tls.tune_tcp).
        handshake_timeout_s: a TLS handshake must finish within this.
        on_refused: `on_refused(peer_address, exc)` when a TLS handshake fails (logging).
    """

    def __init__(self, sock: socket.socket,
                 protocol_factory: Callable[[], asyncio.Protocol], *,
                 tls: Callable[[], ssl.SSLContext | None] | None = None,
                 tune: Callable[[socket.socket], None] | None = None,
                 handshake_timeout_s: float = 10.0,
                 on_refused: Callable[[object, OSError], None] | None = None) -> None:
        self._sock = sock
        self._on_refused = on_refused
        self._factory = protocol_factory
        self._tls = tls
        self._tune = tune
        self._handshake_timeout_s = handshake_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reserve: int | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._pending: set[asyncio.Task[object]] = set()
        self.refused = 0  # clients refused for want of a descriptor

    def start(self) -> None:
        """Open the reserve descriptor and start accepting (on the running loop)."""
        self._loop = asyncio.get_running_loop()
        self._sock.setblocking(False)
        self._open_reserve()
        self._loop.add_reader(self._sock.fileno(), self._on_readable)

    def close(self) -> None:
        """Stop accepting and close the listening socket and the reserve. Idempotent."""
        if self._loop is None:
            return
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._sock.fileno() >= 0:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    async def wait_closed(self) -> None:
        """Wait for connections accepted but not yet handed to their protocol."""
        if self._pending:
            await asyncio.wait(set(self._pending))

    def _open_reserve(self) -> None:
        if self._reserve is None:
            try:
                self._reserve = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._reserve = None

    def _on_readable(self) -> None:
        loop = self._loop
        assert loop is not None
        for _ in range(ACCEPTS_PER_WAKEUP):
            try:
                conn, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if fdlimit.note_exhaustion(exc, "accept"):
                    self._refuse()
                    return
                if exc.errno in (getattr(os, "ECONNABORTED", -1),):
                    continue  # the client gave up while waiting in the backlog
                logger.error("accept failed: %s", exc, extra={"action": "accept_failed"})
                self._pause()
                return
            if self._reserve is None:
                self._open_reserve()
            if self._reserve is not None:  # headroom again: this accept and the reserve
                fdlimit.note_ok()
            conn.setblocking(False)
            if self._tune is not None:
                self._tune(conn)
            task = loop.create_task(self._serve(conn, addr))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _serve(self, conn: socket.socket, addr: object) -> None:
        loop = self._loop
        assert loop is not None
        ctx = self._tls() if self._tls is not None else None
        try:
            if ctx is None:
                await loop.connect_accepted_socket(self._factory, conn)
            else:
                await loop.connect_accepted_socket(
                    self._factory, conn, ssl=ctx, ssl_handshake_timeout=self._handshake_timeout_s)
        except OSError as exc:  # no descriptor for the transport's needs; a refused handshake
            fdlimit.note_exhaustion(exc, "connection setup")
            if self._on_refused is not None and isinstance(exc, ssl.SSLError):
                self._on_refused(addr, exc)
            conn.close()

    def _refuse(self) -> None:
        """Out of descriptors: answer one waiting client on the reserve's number, or pause."""
        if self._reserve is None:
            self._open_reserve()
            if self._reserve is None:
                self._pause()
                return
        os.close(self._reserve)
        self._reserve = None
        try:
            conn, _addr = self._sock.accept()
        except OSError:  # someone else took the number first, or the client left
            self._open_reserve()
            self._pause()
            return
        self.refused += 1
        if self._tls is not None:  # a TLS client could not read a plaintext frame
            conn.close()
            self._open_reserve()
            return
        try:
            conn.setblocking(False)
            conn.send(encode_frame(Reply(id=0, error=ErrorBody(
                code="overloaded", message=f"refused: {fdlimit.OUT_OF_FDS} (limit "
                                           f"{fdlimit.current_limit()}); retry later"))))
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            self._end_refusal(conn)
            return
        # Closing with the client's request unread would reset the connection before the
        # client read the refusal: read what it sent; if it sent nothing yet, linger up to
        # REFUSAL_LINGER_S for its request (or its close), holding the reserve's number.
        if _discard_input(conn):
            self._end_refusal(conn)
            return
        loop = self._loop
        assert loop is not None
        timer = loop.call_later(REFUSAL_LINGER_S, self._end_refusal, conn)
        loop.add_reader(conn.fileno(), self._drain_refused, conn, timer)

    def _drain_refused(self, conn: socket.socket, timer: asyncio.TimerHandle) -> None:
        if _discard_input(conn):
            timer.cancel()
            self._end_refusal(conn)

    def _end_refusal(self, conn: socket.socket) -> None:
        if conn.fileno() >= 0:
            assert self._loop is not None
            self._loop.remove_reader(conn.fileno())
            conn.close()
        self._open_reserve()
        if self._reserve is None:
            self._pause()

    def _pause(self) -> None:
        """Stop accepting for RETRY_ACCEPT_S, so a socket that stays readable does not spin."""
        loop = self._loop
        assert loop is not None
        if self._retry is not None or self._sock.fileno() < 0:
            return
        loop.remove_reader(self._sock.fileno())

        def resume() -> None:
            self._retry = None
            if self._sock.fileno() >= 0:
                loop.add_reader(self._sock.fileno(), self._on_readable)
        self._retry = loop.call_later(RETRY_ACCEPT_S, resume)


def _discard_input(conn: socket.socket) -> bool:
    """Read and drop what `conn` has received; True once something (or EOF) was read."""
    got = False
    while True:
        try:
            data = conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return got
        except OSError:
            return True
        if not data:
            return True
        got = True
