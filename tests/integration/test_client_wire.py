"""The client library's connection (coordd.client_wire) against a scripted server on a real
Unix socket: replies cut out of any split of the byte stream, in any order; a connection
that ends or sends what is not a reply fails the calls waiting on it, and the next call
dials again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from coordd.client import CallTimeout, Client, Disconnected
from coordd.net.frames import HEADER, encode_frame

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def _request(reader: asyncio.StreamReader) -> dict:
    (n,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    return msgspec.msgpack.decode(await reader.readexactly(n))


def _reply(req: dict, result: object) -> bytes:
    return encode_frame({"id": req["id"], "result": result})


async def _serve(tmp_path, script: Script) -> tuple[asyncio.AbstractServer, str]:
    """A server whose k-th connection (from 0) runs `script(reader, writer, k)`."""
    path = str(tmp_path / "s.sock")
    count = 0

    async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        k, count = count, count + 1
        try:
            await script(reader, writer, k)
        finally:
            writer.close()

    return await asyncio.start_unix_server(conn, path), path


async def test_replies_split_and_joined_arbitrarily_reach_their_calls(tmp_path):
    async def script(reader, writer, k):
        a, b, c = await _request(reader), await _request(reader), await _request(reader)
        frames = _reply(c, "c") + _reply(a, "a") + _reply(b, "b")  # any order
        for i in range(0, len(frames), 3):  # in pieces of 3 bytes
            writer.write(frames[i:i + 3])
            await writer.drain()
            await asyncio.sleep(0)
        await reader.read()

    server, path = await _serve(tmp_path, script)
    async with server, Client(path, timeout=5) as c:
        got = await asyncio.gather(c.call("x"), c.call("y"), c.call("z"))
        assert got == ["a", "b", "c"]


async def test_a_frame_that_is_not_a_reply_ends_the_connection_and_the_next_call_dials(
        tmp_path):
    async def script(reader, writer, k):
        req = await _request(reader)
        if k == 0:
            writer.write(HEADER.pack(3) + b"\xc1\xc1\xc1")  # not msgpack
        else:
            writer.write(_reply(req, "fine"))
        await writer.drain()
        await reader.read()

    server, path = await _serve(tmp_path, script)
    async with server, Client(path, timeout=5) as c:
        with pytest.raises(Disconnected, match="lost"):
            await c.call("x")
        assert await c.call("x") == "fine"  # a new connection, not a timeout


async def test_a_reply_over_the_clients_cap_ends_the_connection(tmp_path):
    async def script(reader, writer, k):
        req = await _request(reader)
        writer.write(_reply(req, "x" * 2000) if k == 0 else _reply(req, "small"))
        await writer.drain()
        await reader.read()

    server, path = await _serve(tmp_path, script)
    async with server, Client(path, timeout=5, max_frame=1000) as c:
        with pytest.raises(Disconnected, match="over the 1000-byte cap"):
            await c.call("x")
        assert await c.call("x") == "small"


async def test_a_peer_gone_mid_frame_fails_the_call_with_why(tmp_path):
    async def script(reader, writer, k):
        req = await _request(reader)
        writer.write(_reply(req, "never whole")[:-2])
        await writer.drain()

    server, path = await _serve(tmp_path, script)
    async with server, Client(path, timeout=5) as c:
        with pytest.raises(Disconnected, match="bytes read"):  # IncompleteReadError's text
            await c.call("x")


async def test_a_call_times_out_and_a_late_reply_is_dropped(tmp_path):
    async def script(reader, writer, k):
        first = await _request(reader)
        second = await _request(reader)
        writer.write(_reply(first, "late") + _reply(second, "second"))
        await writer.drain()
        await reader.read()

    server, path = await _serve(tmp_path, script)
    async with server, Client(path, timeout=5) as c:
        with pytest.raises(CallTimeout):
            await c.call("x", timeout=0.05)
        assert await c.call("y") == "second"


async def _two_calls_behind_a_full_buffer(c: Client) -> list[asyncio.Future[Any]]:
    """Calls n=1 and n=2, each with a 4 MiB request (far over the socket's and the
    transport's buffers), both waiting in the connection's `drain` (the peer reads
    nothing yet)."""
    big = "x" * (4 << 20)
    calls = [asyncio.ensure_future(c.call("x", {"n": n, "pad": big})) for n in (1, 2)]
    for _ in range(20):
        await asyncio.sleep(0)
    assert c._wire is not None and c._wire.paused
    return calls


async def test_calls_that_wait_together_for_a_full_write_buffer_all_go_on(tmp_path):
    # the server reads nothing until both big requests are written into the client's buffer
    # (over its high-water mark: both calls wait in `drain`); once it reads, each call must
    # get its reply, not only the one that waited last
    go = asyncio.Event()

    async def script(reader, writer, k):
        await go.wait()
        reqs = [await _request(reader), await _request(reader)]
        writer.write(b"".join(_reply(r, r["params"]["n"]) for r in reqs))
        await writer.drain()
        await reader.read()

    server, path = await _serve(tmp_path, script)
    async with server, Client(path, timeout=5) as c:
        calls = await _two_calls_behind_a_full_buffer(c)
        go.set()
        done, _ = await asyncio.wait(calls, timeout=5)
        assert len(done) == 2, "a call waiting on the write buffer never resumed"
        assert [f.result() for f in calls] == [1, 2]


async def test_a_peer_that_reads_nothing_times_the_call_out_and_close_returns(tmp_path):
    # the request sits in a full write buffer: the call's timeout counts from the write,
    # and closing the client does not wait to flush bytes nobody reads
    async def script(reader, writer, k):
        await asyncio.sleep(30)

    server, path = await _serve(tmp_path, script)
    async with server:
        c = Client(path, timeout=0.2)
        with pytest.raises(CallTimeout):
            await asyncio.wait_for(c.call("x", {"pad": "x" * (4 << 20)}), 5)
        stuck = asyncio.ensure_future(c.call("x", {"pad": "x" * (4 << 20)}, timeout=30))
        for _ in range(20):
            await asyncio.sleep(0)
        await asyncio.wait_for(c.close(), 5)
        with pytest.raises(Disconnected, match="closed by this client"):
            await asyncio.wait_for(stuck, 5)


async def test_a_connection_lost_under_a_full_write_buffer_fails_every_waiting_call(tmp_path):
    drop = asyncio.Event()

    async def script(reader, writer, k):
        await drop.wait()  # read nothing, then reset the connection
        writer.transport.abort()

    server, path = await _serve(tmp_path, script)
    async with server, Client(path, timeout=30) as c:
        calls = await _two_calls_behind_a_full_buffer(c)
        drop.set()
        done, _ = await asyncio.wait(calls, timeout=5)
        assert len(done) == 2, "a call waiting on the write buffer never heard of the loss"
        for f in calls:
            with pytest.raises(Disconnected):
                f.result()


async def test_calls_with_different_timeouts_each_time_out_at_their_own(tmp_path):
    # the calls' deadlines share one loop timer (client_wire.Deadlines): a shorter timeout
    # sent after a longer one still fires first, and the longer one still fires after it
    async def script(reader, writer, k):
        await _request(reader), await _request(reader)
        third = await _request(reader)
        writer.write(_reply(third, "third"))
        await writer.drain()
        await reader.read()

    server, path = await _serve(tmp_path, script)
    async with server, Client(path, timeout=30) as c:
        long = asyncio.ensure_future(c.call("x", timeout=0.3))
        await asyncio.sleep(0)
        with pytest.raises(CallTimeout, match="0.05s"):
            await asyncio.wait_for(c.call("y", timeout=0.05), 0.25)
        assert not long.done()
        with pytest.raises(CallTimeout, match="0.3s"):
            await asyncio.wait_for(long, 5)
        assert await c.call("z") == "third"


def _answering(result_of: Callable[[dict[str, Any], int], Any]) -> Any:
    """A server script that reads requests until the client closes and replies only to
    those whose params say `answer`, with `result_of(request, connection number)`."""
    async def script(reader, writer, k):
        while True:
            try:
                req = await _request(reader)
            except asyncio.IncompleteReadError:  # the client closed
                return
            if req["params"].get("answer"):
                writer.write(_reply(req, result_of(req, k)))
    return script


def _errors_of(loop: asyncio.AbstractEventLoop) -> list[dict[str, Any]]:
    """What `loop` reports to its exception handler from now on (a timer's callback that
    raised, a future's exception never retrieved)."""
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    return seen


async def test_calls_cancelled_by_their_callers_leave_no_deadline_behind(tmp_path):
    # each cancelled call's deadline goes with it: the shared timer fails no other call's
    # future, later calls still time out at their own deadline or get their reply, and
    # nothing is left for the loop to report
    seen = _errors_of(asyncio.get_running_loop())
    server, path = await _serve(tmp_path, _answering(lambda req, k: req["params"]["n"]))
    async with server, Client(path, timeout=30) as c:
        cancelled = [asyncio.ensure_future(c.call("x", {"n": n}, timeout=0.05 * (n % 3 + 1)))
                     for n in range(9)]
        await asyncio.sleep(0.01)
        for task in cancelled:
            task.cancel()
        with pytest.raises(asyncio.TimeoutError):  # the caller's own, shorter timeout
            await asyncio.wait_for(c.call("x", {"n": 9}, timeout=30), 0.05)
        assert c._deadlines._due == {}
        slow = asyncio.ensure_future(c.call("x", {"n": 10}, timeout=0.1))
        assert await c.call("x", {"n": 11, "answer": True}, timeout=0.3) == 11
        with pytest.raises(CallTimeout, match="0.1s"):
            await asyncio.wait_for(slow, 5)
        assert all(t.cancelled() for t in cancelled)
    assert seen == []


async def test_calls_in_flight_at_close_fail_and_the_client_times_calls_out_after(tmp_path):
    seen = _errors_of(asyncio.get_running_loop())
    server, path = await _serve(tmp_path, _answering(lambda req, k: k))
    async with server:
        c = Client(path, timeout=30)
        calls = [asyncio.ensure_future(c.call("x", {}, timeout=t)) for t in (0.05, 5, 0.1)]
        await asyncio.sleep(0.01)
        await c.close()
        for f in calls:
            with pytest.raises(Disconnected, match="closed by this client"):
                await f
        assert c._deadlines._timer is None  # no timer left on the loop
        with pytest.raises(CallTimeout):  # a new connection: its calls still time out
            await asyncio.wait_for(c.call("x", {}, timeout=0.05), 5)
        assert await c.call("x", {"answer": True}) == 1
        await c.close()
    assert seen == []
