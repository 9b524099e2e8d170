"""One connection with many requests in flight (a client that gathers its calls) is not a
lone request: the SQLite writer groups them in batches as it does for many connections,
instead of committing each inline (coordd.store.sqlite.writer `submit`, `peers()`).
SQLite only: the batches are the SQLite writer's."""

from __future__ import annotations

import asyncio
import re

from coordd.client import Client

N = 300


def _batches(text: str) -> float:
    return float(re.search(r"^coordd_writer_batch_size_count (\S+)$", text, re.M).group(1))


async def test_many_requests_on_one_connection_are_committed_in_groups(daemon_factory):
    d = daemon_factory(name="pipelined")
    d.start()
    async with Client(d.socket, timeout=30) as c:
        before = _batches((await c.metrics()).text)
        got = await asyncio.gather(*(c.enqueue(kind="k", required_role="cpu", priority=1,
                                               payload={"i": i}) for i in range(N)))
        assert len({r.job_id for r in got}) == N
        batches = _batches((await c.metrics()).text) - before
    assert batches <= N // 4, f"{N} requests in flight on one connection took {batches} commits"
