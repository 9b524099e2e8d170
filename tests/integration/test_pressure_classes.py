"""Overload by class over real sockets (issue 21, finding 8): producers flooding enqueues
past the writer's queue are refused `overloaded`; one worker's heartbeats and renewals,
sent meanwhile on its own connection, are all admitted."""

from __future__ import annotations

import asyncio

from coordd import errors
from coordd.client import Client

PRODUCERS = 8
ROUNDS = 12  # of 64 pipelined enqueues per producer
COOL = {"memory_used_pct": 10.0}


async def test_enqueue_flood_refuses_no_renewal_or_heartbeat(daemon_factory):
    d = daemon_factory("writer_queue_max = 64\n")
    d.start()
    counts = {"enqueued": 0, "enqueue_refused": 0, "holder_ok": 0}
    holder_refused: list[str] = []
    done = asyncio.Event()

    async def producer(c: Client) -> None:
        async def one() -> None:
            try:
                await c.enqueue(kind="k", required_role="cpu", priority=2, payload={})
                counts["enqueued"] += 1
            except errors.Overloaded:
                counts["enqueue_refused"] += 1
        rounds = 0  # flood on until the holder made its calls in it (a loaded machine
        # may run the holder less often than the producers)
        while rounds < ROUNDS or (counts["holder_ok"] < 10 and rounds < 10 * ROUNDS):
            rounds += 1
            await asyncio.gather(*(one() for _ in range(64)))

    async with Client(d.socket, timeout=30) as w:
        await w.heartbeat("w1", ["cpu"], COOL)
        job = await w.enqueue(kind="k", required_role="cpu", priority=0, payload={})
        lease = (await w.claim("w1", lease_s=600)).lease

        async def holder() -> None:
            while not done.is_set():
                for name, call in (("heartbeat", lambda: w.heartbeat("w1", ["cpu"], COOL)),
                                   ("renew", lambda: w.renew(job.job_id, "w1", lease.token,
                                                             600))):
                    try:
                        await call()
                        counts["holder_ok"] += 1
                    except errors.Overloaded as exc:
                        holder_refused.append(f"{name}: {exc}")
                await asyncio.sleep(0)

        producers = [Client(d.socket, timeout=30) for _ in range(PRODUCERS)]
        for c in producers:
            await c.connect()
        h = asyncio.create_task(holder())
        await asyncio.gather(*(producer(c) for c in producers))
        done.set()
        await h
        for c in producers:
            await c.close()
    assert counts["enqueue_refused"], counts  # the flood did overflow the queue
    assert counts["holder_ok"] >= 10, counts
    assert not holder_refused, holder_refused[:3]
