"""Quiet heartbeats in a real coordd on either store (issue 30 item 3): a worker that stops
beating is seen stale when its last beat is `heartbeat_stale_s` old, not before and not
much after, also when coordd was SIGKILLed before it stored the quiet beats' times (the
restart grace's liveness part, bounded by `fresh_s`). Real time: marked slow."""

from __future__ import annotations

import asyncio
import time

import pytest

from coordd.client import Client
from coordd.rules import governance_beat
from tests.conftest import COOL

STALE_S, ROUND_S = 4.0, 1.0  # fresh_s = min(2, 4 - 2) = 2: quiet beats for 2 s at a time
CONFIG = f"heartbeat_stale_s = {STALE_S}\nreaper_interval_s = {ROUND_S}\n"
pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "postgresql"])
def quick_daemon(request, daemon_factory):
    d = daemon_factory(CONFIG, name=request.param)
    if request.param == "postgresql":
        d.store = request.getfixturevalue("pg_db")
    d.start()
    return d


async def beats(c: Client, seconds: float) -> float:
    """Beat every 0.25 s for `seconds`; the monotonic time of the last beat's reply."""
    end = time.monotonic() + seconds
    while True:
        await c.heartbeat("w1", ["cpu"], COOL, incarnation="i1")
        last = time.monotonic()
        if last >= end:
            return last
        await asyncio.sleep(0.25)


async def live_at(sock: str, at: float) -> int:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    async with Client(sock, timeout=10) as c:
        return (await c.status()).workers_live


async def test_a_worker_that_stops_beating_is_stale_on_time(quick_daemon):
    async with Client(quick_daemon.socket, timeout=10) as c:
        last = await beats(c, 3.0)  # full beats and quiet ones, flushed each round
    assert await live_at(quick_daemon.socket, last + STALE_S - 0.6) == 1
    assert await live_at(quick_daemon.socket, last + STALE_S + 0.6) == 0
    async with Client(quick_daemon.socket, timeout=10) as c:
        assert "heartbeat_stale" in (await c.claim("w1")).reasons


async def test_a_sigkill_loses_no_liveness_and_grants_little(quick_daemon):
    bound = governance_beat.restart_bound_s(governance_beat.timing(STALE_S, ROUND_S))
    async with Client(quick_daemon.socket, timeout=10) as c:
        last = await beats(c, 3.0)
    quick_daemon.kill()  # the last quiet beats' times may not be stored
    quick_daemon.start()
    if time.monotonic() < last + STALE_S - 0.6:
        assert await live_at(quick_daemon.socket, last + STALE_S - 0.6) == 1
    assert await live_at(quick_daemon.socket, last + STALE_S + bound + 0.6) == 0
    assert "Traceback" not in quick_daemon.log()
