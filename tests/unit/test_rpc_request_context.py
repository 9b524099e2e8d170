"""Each request's task runs in a copy of its connection's context (coordd.net.connection):
it sees its connection's park scope and reply connection, what one request sets is not
seen by the next, and the bookkeeping a request does in its last step holds when a
drain cancels a request that never began."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from coordd.net import rpc
from coordd.net.budgets import REPLY_CONN
from coordd.net.parking import PARK_SCOPE

from tests.unit.test_rpc_connection_model import FakeTransport, frame, replies

MARK: contextvars.ContextVar[str | None] = contextvars.ContextVar("test_mark", default=None)


def _serve(handler: Any) -> tuple[rpc.Dispatcher, rpc.Connection, FakeTransport]:
    d = rpc.Dispatcher(handler, 1 << 20, lambda peer: True)
    conn = d.accept()
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    conn.peer = rpc.PeerCred(0, 0, 0)
    return d, conn, t


async def test_a_request_sees_its_connection_and_not_what_the_one_before_set():
    seen: list[tuple[Any, Any, Any]] = []

    async def handler(method: str, params: Any) -> Any:
        seen.append((PARK_SCOPE.get(), REPLY_CONN.get(), MARK.get()))
        MARK.set("set by a request")
        return {}

    d, conn, t = _serve(handler)
    _d2, other, _t2 = _serve(handler)
    for i in (1, 2):
        conn.data_received(frame({"id": i, "method": "status", "params": {}}))
        for _ in range(5):
            await asyncio.sleep(0)
    other.data_received(frame({"id": 3, "method": "status", "params": {}}))
    for _ in range(5):
        await asyncio.sleep(0)
    assert seen == [(conn.scope, conn, None), (conn.scope, conn, None),
                    (other.scope, other, None)]
    assert [r["id"] for r in replies(bytes(t.written))] == [1, 2]
    assert MARK.get() is None
    assert not d._tasks and conn._inflight == 0


async def test_drain_cancels_a_request_that_never_began_and_the_peer_still_closes():
    async def handler(method: str, params: Any) -> Any:
        raise AssertionError("never started")

    d, conn, t = _serve(handler)
    conn.data_received(frame({"id": 1, "method": "status", "params": {}}))
    assert len(d._tasks) == 1 and conn._inflight == 1  # created, not yet begun
    d.stop_intake()
    await d.drain(0)
    assert all(task.cancelled() for task in d._tasks.values())
    await d.close_connections(0.1)
    assert t.closing
