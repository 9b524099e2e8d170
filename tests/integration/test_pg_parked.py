"""Parked claims on PostgreSQL (coordd.store.postgres.hooks): woken by the NOTIFY of the
job they may take, never lost, and idle otherwise. Real coordd processes on the session's
throwaway cluster, real clients over the Unix socket.

The parked claims' safety look comes every 30 s (hooks.SAFETY_S): every bound below is far
under it, so a lost wake-up fails the test instead of hiding behind that look."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from typing import Any

import asyncpg
import pytest

from coordd.client import Client
from coordd.rules.gates import NO_MATCHING_ROLE
from coordd.store.postgres import enqueue_tx
from tests.integration.test_pg_daemon import rig  # noqa: F401 - the fixture
from tests.integration.workerbench import COOL

WOKEN_MAX_S = 3.0  # a job enqueued is claimed this fast by a parked claim (safety: 30 s)


async def _parked_worker(sock: str, worker_id: str, role: str, got: dict[str, float],
                         stop: asyncio.Event) -> None:
    """Claim with a long wait, again and again (so claims look and park as jobs land),
    completing each job; note when each was taken."""
    async with Client(sock, timeout=60) as c:
        await c.heartbeat(worker_id, [role], COOL)
        n = 0
        while not stop.is_set():
            n += 1
            res = await c.claim(worker_id, 30, f"{worker_id}-{n}", wait_s=20)
            if res.job is None:
                continue
            got[res.job.job_id] = time.monotonic()
            await c.complete(res.job.job_id, worker_id, res.lease.token, {"ok": True})


async def test_no_wakeup_is_lost_with_concurrent_clients(rig):  # noqa: F811
    """12 workers of two roles park claims over real sockets while a producer enqueues
    singly, in bursts of one transaction, and for the other role: every job is taken
    within WOKEN_MAX_S of its enqueue, each exactly once, in its role."""
    a = rig.coordd("a")
    await a.wait_serving()
    got: dict[str, float] = {}
    stop = asyncio.Event()
    workers = [asyncio.ensure_future(_parked_worker(a.socket, f"w{i}", "cpu" if i % 3 else
                                                    "gpu", got, stop)) for i in range(12)]
    sent: dict[str, float] = {}
    rnd = random.Random(7)
    try:
        await asyncio.sleep(0.5)  # all parked
        async with Client(a.socket, timeout=30) as admin:
            for round_ in range(30):
                role = "gpu" if round_ % 4 == 0 else "cpu"
                if round_ % 5 == 0:  # a burst in one transaction: one credit per job
                    res = await admin.enqueue_batch([{"kind": "m", "required_role": role,
                                                      "priority": 2, "payload": {}}
                                                     for _ in range(6)])
                    ids = [j.job_id for j in res.jobs]
                else:
                    ids = [(await admin.enqueue(kind="m", required_role=role, priority=2,
                                                payload={})).job_id]
                t = time.monotonic()
                sent.update({j: t for j in ids})
                await asyncio.sleep(rnd.choice((0, 0, 0.001, 0.005, 0.02, 0.1)))

            async def all_taken() -> bool:
                return all(j in got for j in sent)
            deadline = time.monotonic() + 10
            while not await all_taken() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            missing = [j for j in sent if j not in got]
            assert not missing, f"{len(missing)} of {len(sent)} jobs never taken"
            late = {j: got[j] - sent[j] for j in sent if got[j] - sent[j] > WOKEN_MAX_S}
            assert not late, late
            for j in sent:
                view = await admin.get_job(j)
                assert view.status == "succeeded" and view.attempts == 1
    finally:
        stop.set()
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


async def test_an_applications_own_transaction_wakes_a_standbys_parked_claim(rig):  # noqa: F811
    """The trigger sends the NOTIFY whoever writes the job: after a take-over, a claim
    parked on the standby is woken by a job an application enqueues in its own
    transaction (coordd.store.postgres.enqueue_tx), not by the 30 s safety look."""
    a = rig.coordd("a")
    await a.wait_serving()
    b = rig.coordd("b")
    await b.wait_log("standby: waiting for the active coordd")
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(5)
    await b.wait_serving()
    async with Client(b.socket, timeout=30) as c:
        await c.heartbeat("w1", ["cpu"], COOL)
        parked = asyncio.ensure_future(c.claim("w1", 30, "c1", wait_s=25))
        await asyncio.sleep(0.5)
        assert not parked.done()
        app = await asyncpg.connect(rig.dsn)
        try:
            async with app.transaction():
                job_id, created = await enqueue_tx.enqueue(app, kind="m", required_role="cpu")
            sent = time.monotonic()
        finally:
            await app.close()
        res = await asyncio.wait_for(parked, 10)
        assert res.job is not None and res.job.job_id == job_id and created
        assert time.monotonic() - sent < WOKEN_MAX_S


def _looks(metrics_text: str) -> float:
    """How many claim looks found no job of the worker's role (the refusal counter)."""
    for line in metrics_text.splitlines():
        if line.startswith('coordd_claim_refusals_total{reason="%s"}' % NO_MATCHING_ROLE):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.slow
async def test_idle_parked_claims_send_no_statements(rig):  # noqa: F811
    """40 parked claims and only a job of a role none of them takes: in 4 s no claim
    looks again (each look would count a `no_matching_role` refusal; before, every claim
    looked every second and at every NOTIFY: >= 160), and the enqueue woke none."""
    a = rig.coordd("a")
    await a.wait_serving()
    clients: list[Any] = []
    parked = []
    try:
        for i in range(40):
            c = await Client(a.socket, timeout=60).__aenter__()
            clients.append(c)
            await c.heartbeat(f"w{i}", ["cpu"], COOL)
            parked.append(asyncio.ensure_future(c.claim(f"w{i}", 30, f"c{i}", wait_s=25)))
        await asyncio.sleep(1.0)
        for i, c in enumerate(clients):  # a parked claim learns its worker's roles anew
            await c.heartbeat(f"w{i}", ["cpu"], COOL)  # from its next heartbeat (push.py)
        async with Client(a.socket, timeout=30) as admin:
            before = _looks((await admin.metrics()).text)
            await admin.enqueue(kind="m", required_role="gpu", priority=2, payload={})
            await asyncio.sleep(4.0)
            after = _looks((await admin.metrics()).text)
        assert after == before, after - before
        assert not any(p.done() for p in parked)
    finally:
        for p in parked:
            p.cancel()
        for c in clients:
            await c.__aexit__(None, None, None)
