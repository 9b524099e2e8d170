"""Reads run on a small pool of read-only connections (issue 21, finding 4): one slow read
(an integrity check, a large page) holds one connection, never the last free one, so
`status` still answers; reads past the bounded queue get `overloaded` at once instead of
waiting for their client's timeout. Real threads, real SQLite connections."""

from __future__ import annotations

import asyncio
import threading

import pytest

from coordd import errors
from coordd.wire.protocol import JobId, ListJobs
from coordd.store.sqlite.readers import ReadPool


def _blocker(release: threading.Event, started: threading.Event):
    def fn(conn):
        started.set()
        release.wait(10)
        return conn.execute("SELECT 1").fetchone()[0]
    return fn


async def _wait_for(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, 5)


async def test_a_slow_read_does_not_hold_status(make_bundle):
    b = await make_bundle(read_connections=2)
    release, started = threading.Event(), threading.Event()
    slow = asyncio.create_task(b.coord.store.readers.run(_blocker(release, started),
                                                         heavy=True))
    await _wait_for(started)
    try:
        st = await asyncio.wait_for(b.coord.status(), 2)  # on the other connection
        assert st.jobs["waiting"] == 0
        # a second heavy read must leave the last connection to the quick ones: it waits
        release2, started2 = threading.Event(), threading.Event()
        slow2 = asyncio.create_task(b.coord.store.readers.run(_blocker(release2, started2),
                                                              heavy=True))
        await asyncio.sleep(0.05)
        assert not started2.is_set() and b.coord.store.readers.waiting == 1
        st = await asyncio.wait_for(b.coord.status(), 2)
        assert st.workers == 0
    finally:
        release.set()
        release2.set()
    assert await slow == 1 and await slow2 == 1
    assert b.coord.store.readers.waiting == 0


async def test_check_does_not_stall_status(make_bundle):
    """`check` (quick_check over the whole file) is a heavy read."""
    b = await make_bundle(read_connections=2)
    for _ in range(20):
        await b.enqueue()
    res = await asyncio.gather(b.coord.check(), *(b.coord.status() for _ in range(8)))
    assert res[0]["quick_check"] == "ok" and all(r.jobs["waiting"] == 20 for r in res[1:])


async def test_a_full_read_queue_answers_overloaded_at_once(make_bundle):
    b = await make_bundle(read_connections=1, read_queue_max=2)
    release, started = threading.Event(), threading.Event()
    holder = asyncio.create_task(b.coord.store.readers.run(_blocker(release, started)))
    await _wait_for(started)
    queued = [asyncio.create_task(b.coord.status()),
              asyncio.create_task(b.coord.list_jobs(ListJobs()))]
    await asyncio.sleep(0.02)
    assert b.coord.store.readers.waiting == 2
    with pytest.raises(errors.Overloaded):  # refused, not queued behind the slow read
        await asyncio.wait_for(b.coord.get_job(JobId(job_id="nope")), 1)
    assert b.coord.store.readers.refused == 1
    release.set()
    assert await holder == 1
    st, page = await asyncio.gather(*queued)
    assert st.jobs["waiting"] == 0 and page.jobs == []


async def test_a_cancelled_waiter_gives_its_place_back(tmp_path):
    """A read cancelled while it waits (its client went away) leaves no connection lost."""
    import sqlite3
    path = str(tmp_path / "r.db")
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.close()
    pool = ReadPool(path, size=1, queue_max=4)
    await pool.start()
    try:
        release, started = threading.Event(), threading.Event()
        holder = asyncio.create_task(pool.run(_blocker(release, started)))
        await _wait_for(started)
        waiter = asyncio.create_task(pool.run(lambda conn: 2))
        await asyncio.sleep(0.01)
        waiter.cancel()
        release.set()
        assert await holder == 1
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert pool.waiting == 0
        assert await asyncio.wait_for(pool.run(lambda conn: 3), 2) == 3
    finally:
        await pool.close()


async def test_status_pollers_share_reads_and_still_see_earlier_writes(make_bundle, monkeypatch):
    """16 status calls at once cost two reads; a status asked after a write has committed
    is read after it, even while an older status read is still running."""
    from coordd.store import views
    b = await make_bundle()
    res = await asyncio.gather(*(b.coord.status() for _ in range(16)))
    assert b.coord._status.runs == 2 and all(r.jobs == res[0].jobs for r in res)
    release, started = threading.Event(), threading.Event()
    real = views.status_live
    calls = []

    def live(conn, now, stale_s, cutoff):
        calls.append(now)
        if len(calls) == 1:
            started.set()
            release.wait(10)
        return real(conn, now, stale_s, cutoff)

    monkeypatch.setattr(views, "status_live", live)
    old = asyncio.create_task(b.coord.status())  # its read started before the enqueue
    await _wait_for(started)
    await b.enqueue()
    new = asyncio.create_task(b.coord.status())
    await asyncio.sleep(0.02)
    release.set()
    await old  # (it may or may not see the job: its read began before the enqueue)
    assert (await new).jobs["waiting"] == 1 and len(calls) == 2  # a read of its own
