"""A TCP proxy in front of PostgreSQL's Unix socket that a drill can freeze: it stops
forwarding in both directions but keeps every socket open, so neither end hears a FIN or
a reset, as across a silent partition. Runs its own event loop in a thread, so it keeps
forwarding whatever the test's loop is doing.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

CHUNK = 65536


class FreezableProxy:
    """Listen on 127.0.0.1 (or `host`) and forward each connection to `upstream` (a Unix
    socket path). `freeze()` stops forwarding (sockets stay open, bytes wait unread);
    `thaw()` resumes; `close()` drops everything.

    Args:
        upstream: the Unix socket of the server (PostgreSQL: `<dir>/.s.PGSQL.<port>`).
        host: the address to listen on (a namespace's veth address in the netns drill).
    """

    def __init__(self, upstream: str, host: str = "127.0.0.1") -> None:
        self.upstream, self.host = upstream, host
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._open: asyncio.Event | None = None
        self._server: Any = None
        self._writers: list[asyncio.StreamWriter] = []
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="pgproxy")

    def start(self) -> FreezableProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._server = await asyncio.start_server(self._accept, self.host, 0,
                                                  family=socket.AF_INET)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_r, up_w = await asyncio.open_unix_connection(self.upstream)
        except OSError:
            writer.close()
            return
        self._writers += [writer, up_w]
        await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer),
                             return_exceptions=True)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        assert self._open is not None
        while True:
            await self._open.wait()  # frozen: nothing read, nothing written, nothing closed
            data = await src.read(CHUNK)
            await self._open.wait()  # frozen while reading: hold what was read
            if not data:
                dst.close()  # an end closed while forwarding: pass the FIN on
                return
            dst.write(data)
            await dst.drain()

    def freeze(self) -> None:
        """Stop forwarding; every socket stays open (a silent partition)."""
        self._loop.call_soon_threadsafe(self._open.clear)

    def thaw(self) -> None:
        self._loop.call_soon_threadsafe(self._open.set)

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for w in self._writers:
                w.transport.abort()
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()
