"""Fewer round trips per job (issue 30 item 1) with a real coord-worker and a real coordd on
each store: the worker claims up to its free slots at once and takes its next job in the
`complete` that ends the last one. A counting proxy between the worker and coordd counts
the requests by method; the jobs end as they would with one claim per job."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec

from coordd.wire.protocol import Request
from tests.integration.workerbench import bench_over

_decode = msgspec.msgpack.Decoder(Request).decode


@contextlib.asynccontextmanager
async def counting_proxy(target: str, path: Path) -> Any:
    """A Unix socket at `path` that forwards every connection to `target`, counting the
    requests it carries by method (a Counter, yielded)."""
    counts: collections.Counter[str] = collections.Counter()

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   count: bool) -> None:
        try:
            while True:
                head = await reader.readexactly(4)
                body = await reader.readexactly(struct.unpack(">I", head)[0])
                if count:
                    counts[_decode(body).method] += 1
                writer.write(head + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    tasks: set[asyncio.Task[Any]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_unix_connection(target)
        both = asyncio.gather(pump(reader, up_w, True), pump(up_r, writer, False))
        tasks.add(both)  # type: ignore[arg-type]
        with contextlib.suppress(asyncio.CancelledError):
            await both

    server = await asyncio.start_unix_server(serve, str(path))
    try:
        yield counts
    finally:
        server.close()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_worker_claims_in_batches_and_on_complete(store_daemon, tmp_path):
    n = 12
    proxy = tmp_path / "proxy.sock"
    async with counting_proxy(store_daemon.socket, proxy) as counts, \
            bench_over(SimpleNamespace(socket=str(proxy)), tmp_path) as b:
        ids = [await b.enqueue({"echo": i}, priority=2) for i in range(n)]
        p0 = await b.enqueue({"echo": "p0"}, priority=0)
        b.start_worker(kind={"slots": 3, "env": {}})  # (no pid files: 3 models at once)
        views = [await b.status_is(j, "succeeded", "failed") for j in [p0, *ids]]
        assert [v.status for v in views] == ["succeeded"] * (n + 1)
        assert [v.result["echo"] for v in views] == ["p0", *range(n)]
        for v in views:  # each job ran once, under one lease
            assert v.attempts == 1
            assert [e.to_status for e in v.events].count("running") == 1
        assert views[0].events[1].at <= min(v.events[1].at for v in views[1:])  # P0 first
        worker_calls = counts["claim"] + counts["complete"]
        # one claim per job would be 2 calls a job; here a claim takes 3 jobs at once and
        # each complete brings the next: the first claim and the final park (one spare).
        # A job a report brought that waited for the ended run's slot made the reports
        # sent meanwhile ask for nothing, and their slots fell back to claims (4-7 here
        # on a loaded machine).
        assert counts["complete"] == n + 1
        assert counts["claim"] <= 3, counts
        assert worker_calls < 1.5 * (n + 1), counts  # one claim a job: 2 * (n + 1)
