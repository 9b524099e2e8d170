"""Round trips through a real coordd process over its Unix socket."""

from __future__ import annotations

import asyncio
import os
import stat

import pytest

from coordd import errors
from coordd.client import Client

COOL = {"memory_used_pct": 30.0, "temperature_c": 40.0, "on_battery": False,
        "user_idle_s": 10_000.0}


async def test_enqueue_claim_renew_complete_status(daemon):
    async with Client(daemon.socket, timeout=10) as c:
        assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o660
        art = os.path.join(os.path.dirname(daemon.db), "artifacts")  # workers write here
        assert stat.S_IMODE(os.stat(art).st_mode) == 0o2770
        st = await c.status()
        assert st.workers == 0 and st.active_leases == 0
        assert set(st.jobs.values()) == {0}
        job = await c.enqueue(kind="echo", required_role="cpu", priority=1,
                              payload={"x": 1})
        assert job.created
        await c.heartbeat("w1", ["cpu"], COOL)
        got = await c.claim("w1", lease_s=20)
        assert got.job.job_id == job.job_id and got.job.payload == {"x": 1}
        r = await c.renew(job.job_id, "w1", got.lease.token, 20)
        assert r.cancel_requested is False
        await c.complete(job.job_id, "w1", got.lease.token, {"y": 2})
        with pytest.raises(errors.AlreadyCompleted):
            await c.complete(job.job_id, "w1", got.lease.token, {"y": 3})
        view = await c.get_job(job.job_id)
        assert view.status == "succeeded" and view.result == {"y": 2}
        st = await c.status()
        assert st.jobs["succeeded"] == 1 and st.workers == 1
    assert daemon.stop() == 0
    assert not os.path.exists(daemon.socket)


async def test_20_connections_claim_concurrently_no_double_handout(store_daemon):
    daemon = store_daemon  # on either store (tests/integration/conftest.py)
    async with Client(daemon.socket) as admin:
        await admin.enqueue_batch([{"kind": "k", "required_role": "cpu", "priority": 2,
                                    "payload": {"i": i}} for i in range(300)])
    clients = [Client(daemon.socket) for _ in range(20)]
    got: list[str] = []

    async def run(i: int, c: Client) -> None:
        await c.heartbeat(f"w{i}", ["cpu"], COOL)
        while True:
            res = await c.claim(f"w{i}")
            if res.job is None:
                return
            got.append(res.job.job_id)

    try:
        await asyncio.gather(*(run(i, c) for i, c in enumerate(clients)))
    finally:
        for c in clients:
            await c.close()
    assert len(got) == 300 and len(set(got)) == 300


async def test_clean_stop_folds_the_wal_into_the_db_file(daemon, tmp_path):
    """After SIGTERM the .db alone is complete: a copy of it without -wal holds every job."""
    import shutil
    import sqlite3
    async with Client(daemon.socket, timeout=10) as c:
        ids = [(await c.enqueue(kind="k", required_role="cpu", priority=1)).job_id
               for _ in range(20)]
    assert daemon.stop() == 0
    copy = tmp_path / "alone.db"
    shutil.copy(daemon.db, copy)
    conn = sqlite3.connect(copy)
    try:
        assert {r[0] for r in conn.execute("SELECT job_id FROM jobs")} == set(ids)
    finally:
        conn.close()
