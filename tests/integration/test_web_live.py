"""Live streams share one follower of coordd's feed (coordd_web.feed): many tabs hold
one parked coordd call, not one each; a cursor coordd refuses or does not know restarts
at the head instead of aborting or stalling the stream."""

from __future__ import annotations

import asyncio

from starlette.testclient import TestClient

from coordd.client import Client, SyncClient
from coordd_web.app import Settings, build_app
from tests.integration.test_web import BASE, same_uid
from tests.integration.webtools import start_web

STREAMS = 12


async def open_streams(url: str, n: int) -> list[asyncio.StreamWriter]:
    """n SSE streams over raw connections (kept open), each read until coordd-web said
    coordd is up."""
    host, port = url.removeprefix("http://").rsplit(":", 1)

    async def one() -> asyncio.StreamWriter:
        r, w = await asyncio.open_connection(host, int(port))
        w.write(f"GET /events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        await w.drain()
        got = b""
        while b'"up": true' not in got:
            chunk = await r.read(4096)
            assert chunk, got
            got += chunk
        return w
    return await asyncio.wait_for(asyncio.gather(*[one() for _ in range(n)]), 30)


async def test_many_streams_hold_one_parked_call(daemon_factory, tmp_path):
    """coordd allows 3 parked calls in all; 12 tabs used to take 12 and a worker's parked
    claim was refused (overloaded). Now they share one, and the worker's claims park."""
    d = daemon_factory("park_max_total = 3\n")
    d.start()
    web = start_web(tmp_path, d.socket)
    streams = await open_streams(web.url, STREAMS)
    try:
        await asyncio.sleep(1.0)  # each stream's call is parked by now (PACE_S 0.5)
        async with Client(d.socket, timeout=10) as c:
            await c.heartbeat("w1", ["cpu"], {"memory_used_pct": 10.0})
            claims = await asyncio.gather(*[c.claim("w1", lease_s=30, wait_s=0.5)
                                            for _ in range(2)])
            assert all(x.job is None for x in claims)  # parked, not overloaded
    finally:
        for w in streams:
            w.close()
        web.stop()


def read_until(web: TestClient, headers: dict, stop: bytes, url: str = "/events") -> bytes:
    got = b""
    with web.stream("GET", url, headers=headers) as r:
        for chunk in r.iter_bytes():
            got += chunk
            if stop in got:
                break
    return got


def test_a_stream_hears_a_new_job_and_bad_cursors_restart_at_the_head(daemon):
    with SyncClient(daemon.socket) as c:
        c.enqueue(kind="k", required_role="cpu", priority=1)
        head = c.call("feed_head", {})["event_id"]
    app = build_app(Settings(socket=daemon.socket, peer_uid=same_uid))
    with TestClient(app, base_url=BASE) as web:
        # past any event id (coordd refuses it): clamped, then restarted at the head
        got = read_until(web, {"last-event-id": str(1 << 63)}, f"id: {head}\n".encode())
        assert b'"up": true' in got
        # past the head (another database's cursor): the head, not a silent stall
        got = read_until(web, {}, f"id: {head}\n".encode(),
                         url=f"/events?after={head + 500}")
        assert b'"up": true' in got
        # a live job reaches a stream through the shared follower
        with web.stream("GET", f"/events?after={head}") as r:
            got = b""
            for chunk in r.iter_bytes():
                got += chunk
                if b'"up": true' in got and b"job" not in got:
                    with SyncClient(daemon.socket) as c:
                        job = c.enqueue(kind="k", required_role="cpu", priority=1).job_id
                    got += b"job"
                if b'"n": 1' in got:
                    break
        assert job.encode() in got


def test_streams_past_the_cap_get_503(daemon, monkeypatch):
    import coordd_web.live as live
    monkeypatch.setattr(live, "STREAMS_MAX", 0)
    app = build_app(Settings(socket=daemon.socket, peer_uid=same_uid))
    with TestClient(app, base_url=BASE) as web:
        r = web.get("/events")
    assert r.status_code == 503 and "too many live streams" in r.text


async def test_a_stop_signal_ends_open_streams_at_once(daemon, tmp_path):
    """SIGTERM with a tab's stream open waited out uvicorn's graceful timeout (2 s),
    then cancelled the stream: 'timeout graceful shutdown exceeded' and a CancelledError
    traceback per open tab. Streams now end when the shutdown begins."""
    import signal
    web = start_web(tmp_path, daemon.socket)
    streams = await open_streams(web.url, 2)
    try:
        web.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(web.proc.wait, 30) == 0
    finally:
        for w in streams:
            w.close()
        web.stop()
    log = web.log_path.read_text()
    assert "Traceback" not in log and "graceful shutdown exceeded" not in log, log
