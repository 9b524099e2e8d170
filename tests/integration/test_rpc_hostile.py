"""Hostile and malformed input against a real coordd process (B40; the size caps, B38, are
in test_rpc_size_caps.py).

After every case a normal client is still served and the database passes quick_check.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest

from coordd import errors
from coordd.client import Client

COOL = {"memory_used_pct": 30.0, "temperature_c": 40.0, "on_battery": False,
        "user_idle_s": 10_000.0}
REPLY_TIMEOUT_S = 10.0
MiB = 1 << 20


def frame(obj: Any) -> bytes:
    """A request frame: 4-byte big-endian length, then msgpack."""
    body = msgspec.msgpack.encode(obj)
    return struct.pack(">I", len(body)) + body


def raw_frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


async def read_reply(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """Read one reply frame; None when the daemon closed the connection."""
    try:
        head = await asyncio.wait_for(reader.readexactly(4), REPLY_TIMEOUT_S)
    except asyncio.IncompleteReadError as exc:
        assert exc.partial == b"", f"daemon sent a partial header {exc.partial!r}"
        return None
    (n,) = struct.unpack(">I", head)
    return msgspec.msgpack.decode(await asyncio.wait_for(reader.readexactly(n), REPLY_TIMEOUT_S))


async def assert_closed(reader: asyncio.StreamReader) -> None:
    """The daemon closes the connection and sends nothing more."""
    rest = await asyncio.wait_for(reader.read(), REPLY_TIMEOUT_S)
    assert rest == b"", f"expected close, got {len(rest)} more bytes"


async def assert_healthy(socket_path: str) -> None:
    """A fresh, well-behaved client is served and the live database is sound."""
    async with Client(socket_path, timeout=REPLY_TIMEOUT_S) as c:
        st = await c.status()
        assert set(st.jobs) >= {"waiting", "running", "succeeded", "failed", "cancelled"}
        check = await c.check()
        assert check["quick_check"] == "ok" and check["foreign_key_violations"] == 0


async def wait_for_log(daemon, needle: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while needle not in Path(daemon.log_path).read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{needle!r} not logged: {daemon.log()}"
        await asyncio.sleep(0.02)


async def open_raw(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_unix_connection(path)


# ------------------------------------------------------------------ B40 framing


async def test_b40_http_text_gets_one_error_then_close(daemon):
    r, w = await open_raw(daemon.socket)
    w.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await w.drain()
    reply = await read_reply(r)
    assert reply is not None and reply["id"] == 0
    # "GET " as a big-endian length is ~1.2 GB: over the cap, refused before any body read
    assert reply["error"]["code"] in ("payload_too_large", "bad_request")
    await assert_closed(r)
    w.close()
    await wait_for_log(daemon, "refused frame")
    await assert_healthy(daemon.socket)


async def test_b40_ssh_banner_with_small_length_gets_one_bad_request(daemon):
    """Bytes below 0x80 are valid msgpack ints: a body of them is still not an envelope."""
    r, w = await open_raw(daemon.socket)
    banner = b"SSH-2.0-OpenSSH_9.6\r\n"
    w.write(raw_frame(banner) + banner * 4)
    await w.drain()
    reply = await read_reply(r)
    assert reply == {"id": 0, "error": {"code": "bad_request", "message": reply["error"]["message"]}}
    await assert_closed(r)
    w.close()
    await assert_healthy(daemon.socket)


async def test_b40_split_one_byte_writes(daemon):
    data = frame({"id": 7, "method": "enqueue", "params": {
        "kind": "k", "required_role": "cpu", "priority": 1, "payload": {"split": True}}})
    r, w = await open_raw(daemon.socket)
    for i in range(len(data)):
        w.write(data[i:i + 1])
        await w.drain()
        await asyncio.sleep(0.005)
    reply = await read_reply(r)
    assert reply is not None and reply["id"] == 7 and "error" not in reply
    job_id = reply["result"]["job_id"]
    w.write(frame({"id": 8, "method": "get_job", "params": {"job_id": job_id}}))
    reply = await read_reply(r)
    assert reply["id"] == 8 and reply["result"]["payload"] == {"split": True}
    w.close()
    async with Client(daemon.socket) as c:
        assert (await c.status()).jobs["waiting"] == 1  # processed exactly once
    await assert_healthy(daemon.socket)


async def test_b40_two_requests_one_write(daemon):
    r, w = await open_raw(daemon.socket)
    w.write(frame({"id": 11, "method": "enqueue", "params": {
        "kind": "k", "required_role": "cpu", "priority": 0, "payload": 1}})
        + frame({"id": 12, "method": "status", "params": {}}))
    await w.drain()
    replies = {}
    for _ in range(2):
        reply = await read_reply(r)
        assert reply is not None and "error" not in reply, reply
        replies[reply["id"]] = reply["result"]
    assert set(replies) == {11, 12}
    assert len(replies[11]["job_id"]) > 0 and replies[11]["created"] is True
    assert "jobs" in replies[12]
    w.close()
    await assert_healthy(daemon.socket)


@pytest.mark.parametrize("obj", [
    [1, "status", {}],                        # a list, not a map
    {"id": 1, "params": {}},                  # no method
    {"method": "status", "params": {}},       # no id
    {"id": "1", "method": "status"},          # id of the wrong type
    5,                                        # a bare msgpack int
], ids=["list", "no_method", "no_id", "str_id", "int"])
async def test_b40_wrong_envelope_gets_bad_request_then_close(daemon, obj):
    r, w = await open_raw(daemon.socket)
    w.write(frame(obj))
    await w.drain()
    reply = await read_reply(r)
    assert reply is not None and reply["error"]["code"] == "bad_request"
    await assert_closed(r)
    w.close()
    await assert_healthy(daemon.socket)


async def test_b40_trailing_garbage_in_body_gets_bad_request_then_close(daemon):
    r, w = await open_raw(daemon.socket)
    body = msgspec.msgpack.encode({"id": 1, "method": "status", "params": {}}) + b"\x01\x02"
    w.write(raw_frame(body))
    reply = await read_reply(r)
    assert reply["error"]["code"] == "bad_request"
    await assert_closed(r)
    w.close()
    await assert_healthy(daemon.socket)


async def test_wrong_param_types_bad_request_connection_stays_usable(daemon):
    r, w = await open_raw(daemon.socket)
    bad = [
        {"kind": "k", "required_role": "cpu", "priority": "high"},
        {"kind": 3, "required_role": "cpu", "priority": 1},
        {"required_role": "cpu", "priority": 1},
    ]
    for i, params in enumerate(bad, start=1):
        w.write(frame({"id": i, "method": "enqueue", "params": params}))
    w.write(frame({"id": 20, "method": "claim", "params": [1, 2]}))       # params not a map
    w.write(frame({"id": 21, "method": "get_job", "params": {"job_id": None}}))
    w.write(frame({"id": 22, "method": "status", "params": {}}))
    await w.drain()
    got = {}
    for _ in range(6):
        reply = await read_reply(r)
        assert reply is not None
        got[reply["id"]] = reply
    for i in (1, 2, 3, 20, 21):
        assert got[i]["error"]["code"] == "bad_request", got[i]
    assert "jobs" in got[22]["result"]
    w.close()
    await assert_healthy(daemon.socket)


async def test_unknown_method_connection_stays_usable(daemon):
    r, w = await open_raw(daemon.socket)
    w.write(frame({"id": 1, "method": "drop_tables", "params": {}}))
    reply = await read_reply(r)
    assert reply["id"] == 1 and reply["error"]["code"] == "unknown_method"
    w.write(frame({"id": 2, "method": "status", "params": {}}))
    reply = await read_reply(r)
    assert reply["id"] == 2 and "jobs" in reply["result"]
    w.close()
    async with Client(daemon.socket) as c:
        with pytest.raises(errors.UnknownMethod):
            await c.call("no_such_method", {})
        assert (await c.status()).workers == 0  # same client connection still served
    await assert_healthy(daemon.socket)


async def test_truncated_frame_then_disconnect_logged_daemon_keeps_serving(daemon):
    async with Client(daemon.socket) as bystander:
        r, w = await open_raw(daemon.socket)
        body = msgspec.msgpack.encode({"id": 1, "method": "enqueue", "params": {
            "kind": "k", "required_role": "cpu", "priority": 1}})
        w.write(struct.pack(">I", len(body)) + body[: len(body) // 2])
        await w.drain()
        w.close()
        await wait_for_log(daemon, "went away mid-frame")
        r2, w2 = await open_raw(daemon.socket)
        w2.write(b"\x00\x00")  # half a header, then gone
        await w2.drain()
        w2.close()
        await bystander.status()
    async with Client(daemon.socket) as c:
        assert (await c.status()).jobs["waiting"] == 0  # the half-sent enqueue never ran
    await assert_healthy(daemon.socket)


async def test_peer_that_never_reads_replies_does_not_stall_others(daemon):
    """Replies are written with back-pressure: a peer that pipelines requests and does not
    read stalls only itself, the daemon's memory stays bounded, and once the peer reads
    it gets every reply."""
    async with Client(daemon.socket) as c:
        job = await c.enqueue(kind="k", required_role="cpu", priority=1,
                              payload={"x": "y" * 500_000})
    proc = psutil.Process(daemon.proc.pid)
    rss0 = proc.memory_info().rss
    n = 400  # ~200 MiB of replies if the daemon buffered them all
    r, w = await open_raw(daemon.socket)
    w.write(b"".join(frame({"id": i, "method": "get_job", "params": {"job_id": job.job_id}})
                     for i in range(1, n + 1)))
    await w.drain()
    grew = 0
    async with Client(daemon.socket, timeout=REPLY_TIMEOUT_S) as other:
        deadline = time.monotonic() + 1.5  # others are served while the peer sits on replies
        while time.monotonic() < deadline:
            await other.status()
            grew = max(grew, proc.memory_info().rss - rss0)
            if grew > 100 * MiB:
                break
    assert grew < 100 * MiB, f"daemon buffered {grew / MiB:.0f} MiB of unread replies"
    seen = set()
    for _ in range(n):
        reply = await read_reply(r)
        assert reply is not None and len(reply["result"]["payload"]["x"]) == 500_000
        seen.add(reply["id"])
    assert seen == set(range(1, n + 1))
    w.close()
    await assert_healthy(daemon.socket)


# ------------------------------------------------------------------ permissions


async def test_admin_uids_exclude_caller_enqueue_denied_status_served(daemon_factory):
    other = os.getuid() + 12345
    d = daemon_factory(config_text=f"admin_uids = [{other}]\n")
    d.start()
    async with Client(d.socket) as c:
        with pytest.raises(errors.PermissionDenied):
            await c.enqueue(kind="k", required_role="cpu", priority=1, payload=None)
        with pytest.raises(errors.PermissionDenied):
            await c.backup(str(Path(d.db).with_name("copy.db")))
        st = await c.status()
        assert st.jobs["waiting"] == 0
        await c.heartbeat("w1", ["cpu"], COOL)  # worker methods are not admin methods
    assert not Path(d.db).with_name("copy.db").exists()
    await assert_healthy(d.socket)


async def test_default_admin_set_is_root_and_own_uid(daemon):
    async with Client(daemon.socket) as c:
        job = await c.enqueue(kind="k", required_role="cpu", priority=1, payload=None)
        assert job.created


def _deep_request(method: str, depth: int, req_id: int = 5) -> bytes:
    """A request frame whose params carry a list nested `depth` levels (raw msgpack: the
    client library would refuse to build it)."""
    deep = b"\x91" * depth + b"\x90"
    params = (b"\x83" + msgspec.msgpack.encode("sender") + msgspec.msgpack.encode("a")
              + msgspec.msgpack.encode("recipient") + msgspec.msgpack.encode("b")
              + msgspec.msgpack.encode("content") + deep)
    head = (b"\x83" + msgspec.msgpack.encode("id") + msgspec.msgpack.encode(req_id)
            + msgspec.msgpack.encode("method") + msgspec.msgpack.encode(method)
            + msgspec.msgpack.encode("params"))
    return raw_frame(head + params)


@pytest.mark.parametrize("depth", [1_000, 100_000])
async def test_params_nested_past_the_decoder_get_bad_request_not_a_traceback(daemon, depth):
    """msgspec raises RecursionError (not DecodeError) on very deep msgpack: that is a
    refusal like any malformed frame, answered and logged, never an unhandled traceback."""
    r, w = await open_raw(daemon.socket)
    try:
        w.write(_deep_request("send_message", depth))
        await w.drain()
        reply = await read_reply(r)
        assert reply is not None, "connection dropped without a reply"
        assert reply["error"]["code"] == "bad_request"
        assert "nested too deep" in reply["error"]["message"]
        await assert_closed(r)
    finally:
        w.close()
    await wait_for_log(daemon, "refused frame")
    log = daemon.log()
    assert "Traceback" not in log and "client_connected_cb" not in log, log
    await assert_healthy(daemon.socket)
    async with Client(daemon.socket) as c:
        assert (await c.read_messages("b")).messages == []


async def test_message_nested_past_the_depth_cap_refused_over_the_socket(daemon):
    """Deep but decodable (300 levels): refused by the depth cap with the field named."""
    r, w = await open_raw(daemon.socket)
    try:
        w.write(_deep_request("send_message", 300))
        await w.drain()
        reply = await read_reply(r)
        assert reply["id"] == 5 and reply["error"]["code"] == "bad_request"
        assert "content nests deeper than 64 levels" in reply["error"]["message"]
        w.write(frame({"id": 6, "method": "status", "params": {}}))  # still usable
        assert (await read_reply(r))["id"] == 6
    finally:
        w.close()
    async with Client(daemon.socket) as c:
        assert (await c.read_messages("b")).messages == []
