"""The RPC connection (coordd.net.rpc.Connection) over a real Unix socket: framing across
arbitrary read boundaries, pipelining past the in-flight cap, back-pressure, EOF, close.

The first tests serve a Dispatcher in this process with a handler the test controls; the
last ones run against a real coordd process.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from coordd.net import connection, rpc
from coordd.client import Client

REPLY_TIMEOUT_S = 10.0


def frame(obj: Any) -> bytes:
    body = msgspec.msgpack.encode(obj)
    return struct.pack(">I", len(body)) + body


def req(i: int, method: str = "status", params: Any = None) -> bytes:
    return frame({"id": i, "method": method, "params": {} if params is None else params})


async def read_reply(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """One reply frame; None when the other side closed."""
    try:
        head = await asyncio.wait_for(reader.readexactly(4), REPLY_TIMEOUT_S)
    except asyncio.IncompleteReadError as exc:
        assert exc.partial == b""
        return None
    (n,) = struct.unpack(">I", head)
    return msgspec.msgpack.decode(await asyncio.wait_for(reader.readexactly(n), REPLY_TIMEOUT_S))


async def read_until_close(reader: asyncio.StreamReader) -> list[dict[str, Any]]:
    replies = []
    while (reply := await read_reply(reader)) is not None:
        replies.append(reply)
    return replies


@contextlib.contextmanager
def raw_peer(path: str) -> Iterator[socket.socket]:
    """A blocking socket that reads nothing unless told (an asyncio reader would drain
    the daemon's buffer into its own)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(REPLY_TIMEOUT_S)
    try:
        s.connect(path)
        yield s
    finally:
        s.close()


def recv_replies(s: socket.socket, n: int) -> list[dict[str, Any]]:
    """Read up to `n` reply frames; fewer when the other side closes or resets first."""
    buf = b""
    replies: list[dict[str, Any]] = []
    while len(replies) < n:
        try:
            chunk = s.recv(1 << 20)
        except ConnectionResetError:
            break
        if not chunk:
            break
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
            (size,) = struct.unpack(">I", buf[:4])
            replies.append(msgspec.msgpack.decode(buf[4:4 + size]))
            buf = buf[4 + size:]
    return replies


@dataclass
class Served:
    """A Dispatcher on a socket in this process; `handler` answers `{"n": seq}` after
    waiting for `gate`, and counts the calls running at once."""

    path: str
    dispatcher: rpc.Dispatcher
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    running: int = 0
    most_running: int = 0
    calls: int = 0
    reply_bytes: int = 0  # > 0: the result carries a string of this size

    async def handler(self, method: str, params: Any) -> Any:
        self.calls += 1
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await self.gate.wait()
        finally:
            self.running -= 1
        return {"n": self.calls, "blob": "x" * self.reply_bytes}

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(self.path, limit=1 << 24)


@pytest.fixture
async def served(tmp_path) -> AsyncIterator[Served]:
    s = Served(path=str(tmp_path / "rpc.sock"), dispatcher=None)  # type: ignore[arg-type]
    s.dispatcher = rpc.Dispatcher(s.handler, 1 << 20, lambda peer: True)
    server = await asyncio.get_running_loop().create_unix_server(s.dispatcher.accept,
                                                                 path=s.path)
    yield s
    server.close()
    s.gate.set()
    await s.dispatcher.drain(2.0)
    await s.dispatcher.close_connections(2.0)
    await asyncio.wait_for(server.wait_closed(), 5.0)


async def test_frames_cut_at_every_boundary_all_decode(served):
    """40 frames sent in random chunks of 1..13 bytes (a header or body split anywhere,
    several frames' pieces in one write) are all served, each once, with its id."""
    served.gate.set()
    data = b"".join(req(i, params={"pad": "p" * i}) for i in range(1, 41))
    r, w = await served.connect()
    rng = random.Random(5)
    pos = 0
    while pos < len(data):
        step = rng.randint(1, 13)
        w.write(data[pos:pos + step])
        await w.drain()
        await asyncio.sleep(0)
        pos += step
    ids = [(await read_reply(r))["id"] for _ in range(40)]
    assert sorted(ids) == list(range(1, 41)) and served.calls == 40
    w.close()


async def test_pipelined_past_the_inflight_cap_all_answered_at_most_cap_at_once(served):
    """300 requests in one write: at most INFLIGHT_PER_CONNECTION run at once, the rest
    wait unread, and every one is answered with its id once the handler is released."""
    n = 300
    r, w = await served.connect()
    w.write(b"".join(req(i) for i in range(1, n + 1)))
    await w.drain()
    for _ in range(200):
        await asyncio.sleep(0.005)
    assert served.running == rpc.INFLIGHT_PER_CONNECTION
    served.gate.set()
    seen = {(await read_reply(r))["id"] for _ in range(n)}
    assert seen == set(range(1, n + 1))
    assert served.calls == n and served.most_running == rpc.INFLIGHT_PER_CONNECTION
    w.write(req(n + 1))  # the connection is still served
    assert (await read_reply(r))["id"] == n + 1
    w.close()


async def test_half_close_after_pipelining_gets_every_reply_then_close(served):
    """A peer that sends 150 requests and shuts its write side gets 150 replies, then EOF,
    though the EOF came while 86 of them still waited behind the in-flight cap."""
    r, w = await served.connect()
    w.write(b"".join(req(i) for i in range(1, 151)))
    w.write_eof()
    for _ in range(40):
        await asyncio.sleep(0.005)
    assert served.running == rpc.INFLIGHT_PER_CONNECTION
    served.gate.set()
    replies = await read_until_close(r)
    assert sorted(x["id"] for x in replies) == list(range(1, 151))
    assert all("result" in x for x in replies)
    w.close()


async def test_peer_that_stops_reading_pauses_only_its_own_connection(served):
    """A peer pipelining requests with 200 kB replies and reading none: coordd stops taking
    its requests once its write buffer is full (so far fewer than sent are started), while
    another connection is served at once; when the peer reads, it gets every reply."""
    served.gate.set()
    served.reply_bytes = 200_000
    n = 400
    with raw_peer(served.path) as peer:
        peer.sendall(b"".join(req(i) for i in range(1, n + 1)))
        for _ in range(100):
            await asyncio.sleep(0.005)
        started = served.calls
        assert started <= 2 * rpc.INFLIGHT_PER_CONNECTION, f"{started} requests taken unread"
        r2, w2 = await served.connect()
        w2.write(req(9999))
        reply = await read_reply(r2)
        assert reply["id"] == 9999 and len(reply["result"]["blob"]) == 200_000
        w2.close()
        replies = await asyncio.to_thread(recv_replies, peer, n)
    assert {x["id"] for x in replies} == set(range(1, n + 1))


async def test_over_cap_length_refused_rest_of_the_write_dropped(served):
    """A request, then a header over the cap with body bytes and a further request in the
    same write: the first is answered, the oversize frame gets payload_too_large (id 0),
    the connection closes, and nothing after the oversize header is served."""
    served.gate.set()
    r, w = await served.connect()
    w.write(req(1) + struct.pack(">I", (1 << 20) + 1) + bytes(5000) + req(3))
    replies = await read_until_close(r)
    by_id = {x["id"]: x for x in replies}
    assert set(by_id) == {0, 1}, replies
    assert by_id[0]["error"]["code"] == "payload_too_large"
    assert "result" in by_id[1] and served.calls == 1
    w.close()


async def test_over_cap_length_body_is_not_read(served):
    """After an over-cap header the daemon stops reading: a peer pushing the 64 MiB body
    gets EPIPE/ECONNRESET long before it is through, after one error reply."""
    def push() -> tuple[int, bytes]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(REPLY_TIMEOUT_S)
            s.connect(served.path)
            s.sendall(struct.pack(">I", 64 << 20))
            sent = 0
            try:
                while sent < 64 << 20:
                    sent += s.send(bytes(1 << 20))
            except (BrokenPipeError, ConnectionResetError):
                pass
            got = b""
            try:
                while chunk := s.recv(65536):
                    got += chunk
            except ConnectionResetError:
                pass
            return sent, got

    sent, got = await asyncio.to_thread(push)
    assert sent < 16 << 20, f"{sent} body bytes went in"
    (n,) = struct.unpack(">I", got[:4])
    assert len(got) == 4 + n
    assert msgspec.msgpack.decode(got[4:])["error"]["code"] == "payload_too_large"


async def test_bad_envelope_after_good_request_answers_both_then_closes(served):
    served.gate.set()
    r, w = await served.connect()
    w.write(req(1) + frame([1, "status", {}]) + req(3))
    replies = await read_until_close(r)
    by_id = {x["id"]: x for x in replies}
    assert set(by_id) == {0, 1}
    assert by_id[0]["error"]["code"] == "bad_request" and "result" in by_id[1]
    assert served.calls == 1
    w.close()


async def test_stop_intake_answers_overloaded_and_drain_finishes_in_flight(served):
    r, w = await served.connect()
    w.write(req(1))
    await w.drain()
    while served.running < 1:
        await asyncio.sleep(0.005)
    served.dispatcher.stop_intake()
    w.write(req(2))
    reply = await read_reply(r)
    assert reply["id"] == 2 and reply["error"]["code"] == "overloaded"
    assert "shutting down" in reply["error"]["message"]
    drained = asyncio.create_task(served.dispatcher.drain(5.0))
    await asyncio.sleep(0.05)
    assert not drained.done()
    served.gate.set()
    await asyncio.wait_for(drained, 5.0)
    assert (await read_reply(r))["id"] == 1
    await served.dispatcher.close_connections(2.0)
    assert await read_reply(r) is None
    w.close()


async def test_close_connections_gives_up_on_a_peer_that_does_not_read(served):
    """close_connections returns within its timeout even when a peer leaves megabytes of
    replies unread; that connection is aborted, so the peer gets fewer than all replies."""
    served.gate.set()
    served.reply_bytes = 500_000
    with raw_peer(served.path) as peer:
        peer.sendall(b"".join(req(i) for i in range(1, 21)))
        while served.calls < 20:
            await asyncio.sleep(0.005)
        await served.dispatcher.drain(2.0)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await served.dispatcher.close_connections(0.3)
        assert loop.time() - t0 < 2.0
        assert not served.dispatcher._conns
        replies = await asyncio.to_thread(recv_replies, peer, 20)
    assert len(replies) < 20


async def test_flush_after_eof_is_cut_off_after_the_flush_timeout(served, monkeypatch):
    """A peer that half-closes and never reads its (large) replies is dropped after
    FLUSH_TIMEOUT_S instead of holding the connection and its buffer forever."""
    monkeypatch.setattr(connection, "FLUSH_TIMEOUT_S", 0.2)
    served.gate.set()
    served.reply_bytes = 500_000
    with raw_peer(served.path) as peer:
        peer.sendall(b"".join(req(i) for i in range(1, 11)))
        peer.shutdown(socket.SHUT_WR)
        while served.calls < 10:
            await asyncio.sleep(0.005)
        for _ in range(100):
            if not served.dispatcher._conns:
                break
            await asyncio.sleep(0.02)
        assert not served.dispatcher._conns, "connection still open past FLUSH_TIMEOUT_S"
        replies = await asyncio.to_thread(recv_replies, peer, 10)
    assert len(replies) < 10


# ------------------------------------------------------------------ against coordd


async def test_coordd_pipelined_enqueues_one_connection_each_once(daemon):
    """200 enqueues in one write (past the in-flight cap): 200 replies with their ids and
    200 distinct jobs."""
    r, w = await asyncio.open_unix_connection(daemon.socket)
    w.write(b"".join(req(i, "enqueue", {"kind": "k", "required_role": "cpu", "priority": 2,
                                        "payload": {"i": i}}) for i in range(1, 201)))
    await w.drain()
    replies = [await read_reply(r) for _ in range(200)]
    assert sorted(x["id"] for x in replies) == list(range(1, 201))
    assert len({x["result"]["job_id"] for x in replies}) == 200
    w.close()
    async with Client(daemon.socket) as c:
        assert (await c.status()).jobs["waiting"] == 200


async def test_coordd_unread_big_replies_hold_back_later_requests(daemon):
    """Back-pressure stops reading, not just writing: enqueues queued behind 300 unread
    100 kB get_job replies do not run while the peer does not read (others are served),
    and all run once it reads."""
    async with Client(daemon.socket) as c:
        job = await c.enqueue(kind="k", required_role="cpu", priority=1,
                              payload={"x": "y" * 100_000})
    r, w = await asyncio.open_unix_connection(daemon.socket, limit=1 << 22)
    w.write(b"".join(req(i, "get_job", {"job_id": job.job_id}) for i in range(1, 301))
            + b"".join(req(i, "enqueue", {"kind": "k", "required_role": "cpu", "priority": 2})
                       for i in range(301, 306)))
    await w.drain()
    async with Client(daemon.socket, timeout=REPLY_TIMEOUT_S) as other:
        for _ in range(10):
            assert (await other.status()).jobs["waiting"] == 1
            await asyncio.sleep(0.05)
    seen = {(await read_reply(r))["id"] for _ in range(305)}
    assert seen == set(range(1, 306))
    w.close()
    async with Client(daemon.socket) as c:
        assert (await c.status()).jobs["waiting"] == 6
