"""Size caps against a real coordd process (B38): a frame over the inbound cap is refused
with one reply while other clients are served, the client refuses to send over its own
cap, and a reply over the cap becomes that request's error.
"""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

import msgspec
import psutil
import pytest

from coordd import errors
from coordd.client import Client
from tests.integration.test_rpc_hostile import (
    COOL, MiB, REPLY_TIMEOUT_S, assert_healthy, wait_for_log,
)


BIG_CONFIG = f"max_result_bytes = {16 * MiB}\n"


def push_oversize_frame(path: str, length: int) -> tuple[int, dict[str, Any] | None]:
    """Announce `length` bytes and keep sending the body until the daemon hangs up.

    Returns how many body bytes went out and the daemon's reply (a blocking socket:
    data the daemon sent before closing stays readable after our EPIPE).
    """
    import socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(REPLY_TIMEOUT_S)
        s.connect(path)
        s.sendall(struct.pack(">I", length))
        chunk = bytes(MiB)
        sent = 0
        try:
            while sent < length:
                s.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        buf = b""
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
                buf += data
        except ConnectionResetError:
            pass
    if len(buf) < 4:
        return sent, None
    (n,) = struct.unpack(">I", buf[:4])
    assert len(buf) == 4 + n, "more than one reply, or a torn one"
    return sent, msgspec.msgpack.decode(buf[4:])


async def test_b38_big_frame_rejected_other_clients_unaffected(daemon_factory):
    d = daemon_factory(config_text=BIG_CONFIG)
    d.start()
    proc = psutil.Process(d.proc.pid)
    stop = asyncio.Event()
    answered = 0
    worst = 0.0

    async def poll_status() -> None:
        nonlocal answered, worst
        async with Client(d.socket, timeout=REPLY_TIMEOUT_S) as c:
            while not stop.is_set():
                t0 = time.monotonic()
                await c.status()
                worst = max(worst, time.monotonic() - t0)
                answered += 1
                await asyncio.sleep(0.01)

    poller = asyncio.create_task(poll_status())
    async with Client(d.socket, timeout=30) as c:
        job = await c.enqueue(kind="k", required_role="cpu", priority=1, payload=None)
        await c.heartbeat("w1", ["cpu"], COOL)
        got = await c.claim("w1", lease_s=60)
        big = "r" * (5 * MiB)
        await c.complete(job.job_id, "w1", got.lease.token, {"text": big})
        view = await c.get_job(job.job_id)
        assert view.status == "succeeded" and len(view.result["text"]) == 5 * MiB
        del big, view

    # a frame announcing 200 MiB: an explicit error and a close, body not read
    rss_before = proc.memory_info().rss
    before = answered
    sent, reply = await asyncio.to_thread(push_oversize_frame, d.socket, 200 * MiB)
    assert sent < 32 * MiB, "the daemon read far into an oversize body"
    assert reply is not None and reply["id"] == 0
    assert reply["error"]["code"] == "payload_too_large"
    assert "cap" in reply["error"]["message"]
    await wait_for_log(d, "refused frame")
    assert proc.memory_info().rss < 150 * MiB
    assert proc.memory_info().rss - rss_before < 40 * MiB

    deadline = time.monotonic() + REPLY_TIMEOUT_S
    while answered < before + 5:  # the poller went on being answered throughout
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    stop.set()
    await poller
    assert worst < 5.0
    await assert_healthy(d.socket)


async def test_b38_client_refuses_to_send_over_its_cap(daemon):
    async with Client(daemon.socket, max_frame=64 * 1024) as c:
        job = await c.enqueue(kind="k", required_role="cpu", priority=1, payload=None)
        await c.heartbeat("w1", ["cpu"], COOL)
        got = await c.claim("w1", lease_s=60)
        with pytest.raises(errors.PayloadTooLarge):
            await c.complete(job.job_id, "w1", got.lease.token, "z" * 100_000)
        view = await c.get_job(job.job_id)  # same connection still works; nothing was sent
        assert view.status == "running" and view.result is None
    await assert_healthy(daemon.socket)


async def test_b38_reply_over_cap_becomes_error_for_that_request(daemon_factory):
    d = daemon_factory(config_text=f"max_frame_bytes = {MiB}\nmax_result_bytes = {MiB}\n")
    d.start()
    async with Client(d.socket, max_frame=MiB, timeout=REPLY_TIMEOUT_S) as c:
        await c.heartbeat("w1", ["cpu"], COOL)
        for _ in range(2):
            job = await c.enqueue(kind="k", required_role="cpu", priority=1, payload=None)
            got = await c.claim("w1", lease_s=60)
            await c.complete(job.job_id, "w1", got.lease.token, "q" * 600_000)
        with pytest.raises(errors.PayloadTooLarge, match="reply"):
            await c.list_jobs()  # two 600 kB results do not fit a 1 MiB reply
        assert len((await c.list_jobs(limit=1)).jobs) == 1  # same connection, still served
    await assert_healthy(d.socket)
