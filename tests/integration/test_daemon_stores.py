"""The same daemon tests over either store (tests/integration/conftest.py `store_daemon`):
a real coordd process, `--db` a file or `--store` a fresh PostgreSQL database, reached
over its socket. One Coordinator serves both (issue 27): the replies, codes and waiting
reasons are the same."""

from __future__ import annotations

import asyncio
import time

import pytest

from coordd import errors
from coordd.client import Client
from tests.conftest import COOL


async def test_the_core_on_either_store(store_daemon):
    async with Client(store_daemon.socket, timeout=10) as c:
        await c.heartbeat("w1", ["cpu"], COOL)
        first = await c.enqueue(kind="k", required_role="cpu", priority=2, payload={"n": 1})
        got = await c.claim("w1", lease_s=30)
        assert got.job is not None and got.job.job_id == first.job_id
        assert (await c.renew(first.job_id, "w1", got.lease.token, lease_s=30)).expires_at > 0
        await c.complete(first.job_id, "w1", got.lease.token, {"ok": True})
        with pytest.raises(errors.AlreadyCompleted):
            await c.complete(first.job_id, "w1", got.lease.token, {"ok": True})
        assert (await c.get_job(first.job_id)).result == {"ok": True}

        # a parked claim is woken by the enqueue that gives it work (SQLite: at the
        # commit; PostgreSQL: its NOTIFY, or the 1 s poll at the latest)
        parked = asyncio.ensure_future(c.claim("w1", lease_s=30, wait_s=20))
        await asyncio.sleep(0.3)
        assert not parked.done()
        t0 = time.monotonic()
        second = await c.enqueue(kind="k", required_role="cpu", priority=2, payload={})
        woken = await asyncio.wait_for(parked, 10)
        assert woken.job is not None and woken.job.job_id == second.job_id
        assert time.monotonic() - t0 < 3.0 and woken.waited_s > 0

        # why a job waits: the same reason from either store
        gpu = await c.enqueue(kind="k", required_role="gpu", priority=2, payload={})
        view = await c.get_job(gpu.job_id)
        assert view.status == "waiting" and "gpu" in (view.waiting_reason or ""), view
        listed = await c.list_jobs(status="waiting")
        assert [j.waiting_reason for j in listed.jobs] == [view.waiting_reason]
        assert (await c.cancel(gpu.job_id)).status == "cancelled"
        st = await c.status()
        assert st.jobs["succeeded"] == 1 and st.jobs["running"] == 1
        assert st.jobs["cancelled"] == 1 and st.workers == 1
        assert [w.worker_id for w in (await c.workers()).workers] == ["w1"]

        # maintenance over the store interface: served on both
        assert (await c.call("check", {}))["quick_check"] == "ok"
    assert store_daemon.stop() == 0
    assert "Traceback" not in store_daemon.log()
