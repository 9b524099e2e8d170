"""coordd.net.rpc.Connection driven by a fake transport through random schedules: bytes cut
anywhere, write pauses, requests finishing in any order, EOF. Every request is served
once, in order, never while blocked, every one is answered, and the connection never
stalls with work it could do."""

from __future__ import annotations

import asyncio
import random
import struct
from typing import Any

import msgspec
import pytest

from coordd.net import rpc


def frame(obj: Any) -> bytes:
    body = msgspec.msgpack.encode(obj)
    return struct.pack(">I", len(body)) + body


class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.reading = True
        self.closing = False
        self.aborted = False
        self.lost = False

    def write(self, data: bytes) -> None:
        assert not self.closing
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = self.aborted = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def replies(buf: bytes) -> list[dict[str, Any]]:
    out, pos = [], 0
    while pos < len(buf):
        (n,) = struct.unpack_from(">I", buf, pos)
        out.append(msgspec.msgpack.decode(buf[pos + 4:pos + 4 + n]))
        pos += 4 + n
    return out


async def run_schedule(seed: int) -> None:
    rnd = random.Random(seed)
    loop = asyncio.get_running_loop()
    n_req = rnd.choice([1, 5, 70, 200])
    pad = rnd.choice([0, 10, 3000, 40_000])
    stream = b"".join(frame({"id": i + 1, "method": "status", "params": {"pad": "x" * rnd.randint(0, pad)}})
                      for i in range(n_req))
    send_eof = rnd.random() < 0.6
    started: list[int] = []
    waiting: dict[int, asyncio.Future[None]] = {}
    t = FakeTransport()
    conn: rpc.Connection

    async def handler(method: str, params: Any) -> Any:
        # a request is started only while the connection is not blocked
        assert not conn._write_paused
        assert len(waiting) < rpc.INFLIGHT_PER_CONNECTION
        i = len(started) + 1
        started.append(i)
        fut = waiting[i] = loop.create_future()
        await fut
        del waiting[i]
        return {"i": i}

    d = rpc.Dispatcher(handler, 1 << 20, lambda peer: True)
    conn = d.accept()
    conn.connection_made(t)  # type: ignore[arg-type]
    conn.peer = rpc.PeerCred(0, 0, 0)
    pos = 0
    eof_sent = False
    for _ in range(100_000):
        actions = []
        if t.reading and not t.closing and pos < len(stream):
            actions.append("data")
        if t.reading and not t.closing and pos == len(stream) and send_eof and not eof_sent:
            actions.append("eof")
        if waiting:
            actions.append("finish")
        actions.append("pause" if not conn._write_paused else "resume")
        if not actions:
            break
        a = rnd.choice(actions)
        if a == "data":
            n = rnd.choice([1, 2, 3, 4, 5, 7, 100, 4096, 65536, 1 << 20])
            conn.data_received(stream[pos:pos + n])
            pos = min(pos + n, len(stream))
        elif a == "eof":
            eof_sent = True
            conn.eof_received()
        elif a == "finish":
            i = rnd.choice(list(waiting))
            waiting[i].set_result(None)
        elif a == "pause":
            conn.pause_writing()
        else:
            conn.resume_writing()
        for _ in range(3):
            await asyncio.sleep(0)
        if pos == len(stream) and (eof_sent or not send_eof):
            break
    # settle: let writes flow, finish everything, see the end state
    if conn._write_paused:
        conn.resume_writing()
    for _ in range(200):
        for f in list(waiting.values()):
            if not f.done():
                f.set_result(None)
        await asyncio.sleep(0)
    got = replies(bytes(t.written))
    assert pos == len(stream) or not t.reading, "stalled with bytes the peer wants read"
    assert started == list(range(1, len(started) + 1))
    assert sorted(r["id"] for r in got) == list(range(1, n_req + 1)), (seed, len(got), n_req)
    assert all("result" in r for r in got)
    assert t.closing == send_eof, (seed, t.closing, send_eof)


@pytest.mark.parametrize("seed", range(60))
async def test_random_schedules_serve_every_request_once_and_close_after_eof(seed):
    await run_schedule(seed)
