"""RPC budgets under pressure (issue 21, findings 2 and 3), a Dispatcher in this process on
a real Unix socket, deadlines on a FakeClock: a trickled frame is cut off, large partial
frames share one inbound budget, replies to peers that do not read are bounded per
connection and in total, and a peer that reads nothing is dropped (its bytes freed)."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from coordd import errors
from coordd.net import rpc
from coordd.clock import FakeClock

TIMEOUT_S = 10.0
BLOB = 200_000


def frame(obj: Any) -> bytes:
    body = msgspec.msgpack.encode(obj)
    return struct.pack(">I", len(body)) + body


def req(i: int, params: Any = None) -> bytes:
    return frame({"id": i, "method": "status", "params": params or {}})


@dataclass
class Served:
    path: str
    dispatcher: rpc.Dispatcher
    clock: FakeClock
    blob: int = 0

    async def handler(self, method: str, params: Any) -> Any:
        return {"blob": "x" * self.blob}

    async def peer(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        await asyncio.get_running_loop().sock_connect(s, self.path)
        await until(lambda: len(self.dispatcher._conns) >= 1)
        return s


async def until(cond, what: str = "condition") -> None:
    """Yield to the loop (I/O, not time) until `cond()` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT_S
    while not cond():
        assert loop.time() < deadline, f"{what} not reached"
        await asyncio.sleep(0.005)


async def replies_until_close(s: socket.socket) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    buf = b""
    while True:
        try:
            chunk = await asyncio.wait_for(loop.sock_recv(s, 1 << 20), TIMEOUT_S)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            break
        buf += chunk
    out = []
    while len(buf) >= 4:
        (n,) = struct.unpack(">I", buf[:4])
        out.append(msgspec.msgpack.decode(buf[4:4 + n]))
        buf = buf[4 + n:]
    return out


@pytest.fixture
async def make_served(tmp_path) -> AsyncIterator[Any]:
    made: list[tuple[Served, asyncio.AbstractServer]] = []

    async def make(**limits: Any) -> Served:
        clock = FakeClock()
        s = Served(path=str(tmp_path / f"b{len(made)}.sock"), dispatcher=None, clock=clock)  # type: ignore[arg-type]
        s.dispatcher = rpc.Dispatcher(s.handler, 1 << 20, lambda peer: True,
                                      limits=rpc.Limits(**limits), clock=clock)
        server = await asyncio.get_running_loop().create_unix_server(s.dispatcher.accept,
                                                                     path=s.path)
        made.append((s, server))
        return s

    yield make
    for s, server in made:
        server.close()
        await s.dispatcher.drain(2.0)
        await s.dispatcher.close_connections(2.0)


async def test_trickled_frame_closed_at_its_deadline_whole_frames_keep_theirs(make_served):
    sv = await make_served(frame_timeout_s=5.0)
    loop = asyncio.get_running_loop()
    trickler = await sv.peer()
    steady = await sv.peer()
    await until(lambda: len(sv.dispatcher._conns) == 2)
    big = req(1, {"pad": "p" * 100_000})
    await loop.sock_sendall(trickler, big[:10])
    await loop.sock_sendall(steady, req(1)[:3])
    await until(lambda: all(c._partial_since is not None for c in sv.dispatcher._conns))
    sv.clock.advance(4.0)
    await loop.sock_sendall(trickler, big[10:11])  # bytes keep coming, one at a time
    await loop.sock_sendall(steady, req(1)[3:] + req(2)[:3])  # frame 1 whole, 2 begun
    await asyncio.sleep(0.05)
    assert sv.dispatcher.sweep(sv.clock.mono()) == 0
    sv.clock.advance(2.0)  # the trickled frame is 6 s old, the steady peer's 2 s
    assert sv.dispatcher.sweep(sv.clock.mono()) == 1
    got = await replies_until_close(trickler)
    assert [r["error"]["code"] for r in got] == ["bad_request"], got
    assert "frame_timeout_s" in got[0]["error"]["message"]
    assert len(sv.dispatcher._conns) == 1
    await loop.sock_sendall(steady, req(2)[3:])
    steady.shutdown(socket.SHUT_WR)
    assert [r["id"] for r in await replies_until_close(steady)] == [1, 2]
    trickler.close()
    steady.close()


async def test_large_partial_frames_share_one_inbound_budget(make_served):
    sv = await make_served(max_inbound_bytes=300_000)
    loop = asyncio.get_running_loop()
    big = req(7, {"pad": "p" * 120_000})
    peers = [await sv.peer() for _ in range(3)]
    for p in peers[:2]:
        await loop.sock_sendall(p, big[:1000])
    await until(lambda: sv.dispatcher.inbound_bytes == 2 * (len(big) - 4))
    await loop.sock_sendall(peers[2], big[:1000])  # a third would pass the budget
    got = await replies_until_close(peers[2])
    assert [r["error"]["code"] for r in got] == ["overloaded"], got
    assert "max_inbound_bytes" in got[0]["error"]["message"]
    small = await sv.peer()  # small frames are not held to the budget
    await loop.sock_sendall(small, req(1))
    small.shutdown(socket.SHUT_WR)
    assert [r["id"] for r in await replies_until_close(small)] == [1]
    peers[0].close()  # its reservation goes with it
    await until(lambda: sv.dispatcher.inbound_bytes == len(big) - 4)
    await loop.sock_sendall(peers[1], big[1000:])  # whole: served, reservation released
    peers[1].shutdown(socket.SHUT_WR)
    assert [r["id"] for r in await replies_until_close(peers[1])] == [7]
    assert sv.dispatcher.inbound_bytes == 0
    for p in peers + [small]:
        p.close()


async def test_requests_answered_at_once_wait_for_a_peer_that_does_not_read(make_served):
    """A method answered at once (Dispatcher.at_once, as a quiet heartbeat) is answered
    inside the read, with no task; once its replies fill the write buffer the peer's further
    requests wait unread (back-pressure) instead of being refused, and are all answered
    when it reads."""
    sv = await make_served(max_unsent_bytes=600_000, write_stall_timeout_s=5.0)
    sv.dispatcher.at_once["status"] = lambda params: {"blob": "x" * BLOB}
    loop = asyncio.get_running_loop()
    lazy = await sv.peer()
    await loop.sock_sendall(lazy, b"".join(req(i) for i in range(1, 21)))  # 4 MB of replies
    conn = next(iter(sv.dispatcher._conns))
    await until(lambda: conn._write_paused, "replies made")
    assert not sv.dispatcher._tasks and conn._inflight == 0  # none became a task
    assert conn._buf  # the rest wait, unread
    lazy.shutdown(socket.SHUT_WR)
    got = await replies_until_close(lazy)
    assert sorted(r["id"] for r in got) == list(range(1, 21))
    assert all("result" in r for r in got), [r for r in got if "error" in r][:1]
    lazy.close()


async def test_replies_to_a_peer_that_does_not_read_are_bounded(make_served):
    sv = await make_served(max_unsent_bytes=600_000, write_stall_timeout_s=5.0)
    sv.blob = BLOB
    loop = asyncio.get_running_loop()
    lazy = await sv.peer()
    await loop.sock_sendall(lazy, b"".join(req(i) for i in range(1, 21)))  # 4 MB of replies
    conn = next(iter(sv.dispatcher._conns))
    await until(lambda: not sv.dispatcher._tasks and conn._write_paused, "replies made")
    unsent = conn._transport.get_write_buffer_size()
    assert unsent <= 600_000 + BLOB, unsent
    assert sv.dispatcher.outbound_bytes == unsent
    lazy.shutdown(socket.SHUT_WR)
    got = await replies_until_close(lazy)  # now it reads: every id answered
    assert sorted(r["id"] for r in got) == list(range(1, 21))
    refused = [r for r in got if "error" in r]
    assert refused and all(r["error"]["code"] == "overloaded" for r in refused)
    assert "max_unsent_bytes" in refused[0]["error"]["message"]
    await until(lambda: not sv.dispatcher._conns)
    assert sv.dispatcher.outbound_bytes == 0
    lazy.close()


async def test_a_peer_that_reads_nothing_is_dropped_and_its_bytes_freed(make_served):
    sv = await make_served(max_unsent_bytes=10 << 20, max_outbound_bytes=900_000,
                           write_stall_timeout_s=5.0)
    sv.blob = BLOB
    loop = asyncio.get_running_loop()
    lazy, other = await sv.peer(), await sv.peer()
    await until(lambda: len(sv.dispatcher._conns) == 2)
    await loop.sock_sendall(lazy, b"".join(req(i) for i in range(1, 21)))
    await until(lambda: not sv.dispatcher._tasks and sv.dispatcher.outbound_bytes, "stalled")
    assert sv.dispatcher.outbound_bytes <= 900_000, sv.dispatcher.outbound_bytes
    await loop.sock_sendall(other, req(1))  # the global budget is spent by the lazy peer
    reply = await asyncio.wait_for(loop.sock_recv(other, 1 << 20), TIMEOUT_S)
    assert b"max_outbound_bytes" in reply, reply[:200]
    sv.clock.advance(3.0)
    assert sv.dispatcher.sweep(sv.clock.mono()) == 0
    sv.clock.advance(3.0)  # 6 s without reading a byte
    assert sv.dispatcher.sweep(sv.clock.mono()) == 1
    await until(lambda: len(sv.dispatcher._conns) == 1, "lazy peer dropped")
    assert sv.dispatcher.outbound_bytes == 0
    await loop.sock_sendall(other, req(2))  # the budget is back
    other.shutdown(socket.SHUT_WR)
    got = await replies_until_close(other)
    assert [r.get("error") for r in got] == [None], got
    lazy.close()
    other.close()


async def test_at_once_errors_are_replies_and_none_goes_to_the_handler(make_served):
    """An at-once answer that raises a CoordError is that error's reply, any other
    exception an `internal` one, the connection open; one that says None leaves the
    request to the handler (a task)."""
    sv = await make_served()
    said: list[Any] = []

    def at_once(params: Any) -> Any:
        said.append(params)
        if len(said) == 1:
            raise errors.BadRequest("readings: not a number")
        if len(said) == 2:
            raise KeyError("bug")
        return None

    sv.dispatcher.at_once["status"] = at_once
    loop = asyncio.get_running_loop()
    peer = await sv.peer()
    await loop.sock_sendall(peer, req(1) + req(2) + req(3))
    peer.shutdown(socket.SHUT_WR)
    got = {r["id"]: r for r in await replies_until_close(peer)}
    assert got[1]["error"]["code"] == "bad_request"
    assert got[2]["error"]["code"] == "internal"
    assert got[3]["result"] == {"blob": ""}  # the handler's answer
    assert len(said) == 3
    peer.close()
