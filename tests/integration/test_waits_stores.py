"""The parked calls over either store (tests/integration/conftest.py `store_daemon`): a
real coordd, `--db` or `--store`, over its socket. `wait_job` answers when the job ends
and `watch_worker` when a cancel is requested, each woken by the commit (SQLite: the
writer; PostgreSQL: the NOTIFY of coordd.store.postgres.push_sql), not by a poll; a
reader of `watch_events` resuming from its cursor misses no event, also where
PostgreSQL commits event ids out of order (coordd.store.postgres.waits)."""

from __future__ import annotations

import asyncio
import time

import pytest

from coordd.client import Client
from tests.conftest import COOL

WOKEN_S = 0.6  # a wake-up from the commit, well below PostgreSQL's 1 s claim poll


async def _held(c: Client, worker: str = "w1") -> tuple[str, int]:
    await c.heartbeat(worker, ["cpu"], COOL)
    await c.enqueue(kind="k", required_role="cpu", priority=2, payload={})
    got = await c.claim(worker, lease_s=60)
    assert got.job is not None
    return got.job.job_id, got.lease.token


async def _answered(call: asyncio.Future, t0: float) -> tuple[object, float]:
    res = await asyncio.wait_for(call, 10)
    return res, time.monotonic() - t0


async def test_wait_job_and_watch_worker_are_woken_by_the_commit(store_daemon):
    async with Client(store_daemon.socket, timeout=30) as c, \
            Client(store_daemon.socket, timeout=30) as other:
        job_id, token = await _held(c)
        waiting = asyncio.ensure_future(other.call("wait_job", {"job_id": job_id,
                                                                "timeout_s": 20}))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        t0 = time.monotonic()
        await c.complete(job_id, "w1", token, {"ok": 1})
        res, took = await _answered(waiting, t0)
        assert res["terminal"] is True and res["job"]["status"] == "succeeded"
        assert took < WOKEN_S, took

        # a cancel reaches the worker's parked watch at its commit
        job_id, _ = await _held(c)
        watch = asyncio.ensure_future(other.call("watch_worker", {"worker_id": "w1",
                                                                  "wait_s": 20}))
        await asyncio.sleep(0.3)
        assert not watch.done()
        t0 = time.monotonic()
        await c.cancel(job_id)
        acts, took = await _answered(watch, t0)
        assert acts["cancel"] == [job_id] and took < WOKEN_S, (acts, took)
    assert store_daemon.stop() == 0
    assert "Traceback" not in store_daemon.log()


async def test_watch_events_from_a_cursor_misses_nothing(store_daemon):
    async with Client(store_daemon.socket, timeout=30) as c, \
            Client(store_daemon.socket, timeout=30) as other:
        head = (await c.call("feed_head", {}))["event_id"]
        parked = asyncio.ensure_future(other.call("watch_events", {
            "after": head, "wait_s": 20, "limit": 1000}))
        await asyncio.sleep(0.3)
        assert not parked.done()
        t0 = time.monotonic()
        first = await c.enqueue(kind="k", required_role="cpu", priority=2, payload={})
        got, took = await _answered(parked, t0)
        assert took < WOKEN_S and got["events"], (got, took)
        assert got["events"][0]["job_id"] == first.job_id
        seen = [e["event_id"] for e in got["events"]]
        cursor = got["next_after"]
        ids = [first.job_id]
        for _ in range(5):
            ids.append((await c.enqueue(kind="k", required_role="cpu", priority=2,
                                        payload={})).job_id)
        await c.cancel(ids[1])
        while True:  # resume from each cursor until quiet
            got = await other.call("watch_events", {"after": cursor, "wait_s": 0.5,
                                                    "limit": 2})
            if not got["events"]:
                break
            seen += [e["event_id"] for e in got["events"]]
            cursor = got["next_after"]
        assert seen == sorted(set(seen)) and len(seen) == 7  # 6 enqueues and a cancel
        assert cursor == (await c.call("feed_head", {}))["event_id"]


@pytest.mark.parametrize("end", ["commit", "rollback"])
async def test_postgres_feed_waits_out_an_id_not_yet_committed(pg_db, daemon_factory, end):
    """An event id drawn by a transaction still open holds the feed back; its commit
    hands both events over in id order; a rollback leaves a gap the parked call steps
    over once it is FEED_GAP_SETTLED_S old, looking again by itself (no NOTIFY comes)."""
    import asyncpg
    d = daemon_factory()
    d.store = pg_db
    d.start()
    async with Client(d.socket, timeout=30) as c, Client(d.socket, timeout=30) as other:
        job = await c.enqueue(kind="k", required_role="cpu", priority=2, payload={})
        head = (await c.call("feed_head", {}))["event_id"]
        conn = await asyncpg.connect(pg_db)
        tx = conn.transaction()
        await tx.start()
        held = await conn.fetchval(
            "INSERT INTO job_events (job_id, at, to_status, reason) "
            "VALUES ($1, extract(epoch from clock_timestamp()), 'waiting', 'held') "
            "RETURNING event_id", job.job_id)
        parked = asyncio.ensure_future(other.call("watch_events", {
            "after": head, "wait_s": 20, "limit": 1000}))
        later = await c.enqueue(kind="k", required_role="cpu", priority=2, payload={})
        await asyncio.sleep(0.5)
        assert not parked.done()  # the later event waits behind the open id
        t0 = time.monotonic()
        await (tx.commit() if end == "commit" else tx.rollback())
        await conn.close()
        got, took = await _answered(parked, t0)
        ids = [e["event_id"] for e in got["events"]]
        if end == "commit":
            assert ids[0] == held and ids[-1] > held and took < WOKEN_S, (got, took)
        else:
            assert held not in ids and [e["job_id"] for e in got["events"]] == [later.job_id]
            assert took < 5.0 + 1.5, took  # settled after 5 s, seen within a look's 1 s
    assert d.stop() == 0
    assert "Traceback" not in d.log()
