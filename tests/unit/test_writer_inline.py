"""A lone peer's request commits at once, in its own step (issue 30: the writer's
hand-off at one client); with other peers, or the writer busy, it waits for the group
commit as before."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from coordd import errors


def op(conn: sqlite3.Connection, now: float) -> int:
    assert conn.in_transaction  # inside the batch's BEGIN IMMEDIATE
    return 7


async def _idle(writer) -> None:
    for _ in range(5):  # let the writer's task reach its wait and a loop turn pass
        await asyncio.sleep(0)
    assert writer._idle


async def test_a_lone_peers_request_is_committed_when_submit_returns(bundle):
    writer = bundle.coord.store.writer
    writer.peers = lambda: 1
    await _idle(writer)
    before = writer.stats.batches
    fut = writer.submit(op)
    assert fut.done() and fut.result() == 7  # committed: no loop turn, no writer task
    assert writer.stats.batches == before + 1
    assert not writer._conn.in_transaction


async def test_with_other_peers_requests_wait_for_the_group_commit(bundle):
    writer = bundle.coord.store.writer
    writer.peers = lambda: 2
    await _idle(writer)
    before = writer.stats.batches
    first, second = writer.submit(op), writer.submit(op)
    assert not first.done() and not second.done()
    assert await asyncio.gather(first, second) == [7, 7]
    assert writer.stats.batches == before + 1  # one COMMIT for both


async def test_a_caller_submitting_in_a_row_still_yields_to_the_loop(bundle):
    """A task's second inline batch in a row is queued for the writer's task instead, so
    a loop of writes cannot starve the event loop; once the writer's task has run, and for
    another task with the writer idle, a request runs inline again."""
    writer = bundle.coord.store.writer
    writer.peers = lambda: 1
    await _idle(writer)
    first, second = writer.submit(op), writer.submit(op)
    assert first.done() and not second.done()
    assert await second == 7
    await _idle(writer)
    assert writer.submit(op).done()  # the writer's task ran: inline again

    async def other_task() -> bool:
        return writer.submit(op).done()

    assert writer.submit(op).done() is False  # this task's second in a row
    assert await asyncio.create_task(other_task()) is False  # queued behind it
    await _idle(writer)
    assert await asyncio.create_task(other_task()) is True


async def test_an_outside_write_lock_sends_the_lone_request_to_the_writers_task(make_bundle):
    b = await make_bundle(busy_timeout_ms=300)
    writer = b.coord.store.writer
    writer.peers = lambda: 1
    await _idle(writer)
    outside = sqlite3.connect(b.db_path, isolation_level=None)
    outside.execute("BEGIN IMMEDIATE")
    try:
        fut = writer.submit(op)
        assert not fut.done()  # queued: the task waits for the lock with asyncio sleeps
        with pytest.raises(errors.Overloaded):
            await fut
    finally:
        outside.execute("ROLLBACK")
        outside.close()
    await _idle(writer)
    assert writer.submit(op).result() == 7


async def test_an_inline_op_that_fails_fails_alone_and_leaves_no_transaction(bundle):
    writer = bundle.coord.store.writer
    writer.peers = lambda: 1
    await _idle(writer)

    def bad(conn: sqlite3.Connection, now: float) -> None:
        raise errors.NotFound("no such job")

    fut = writer.submit(bad)
    assert fut.done() and isinstance(fut.exception(), errors.NotFound)
    assert not writer._conn.in_transaction
    assert await writer.submit(op) == 7


async def test_the_daemon_tells_its_writer_how_many_peers_are_connected(tmp_path):
    from coordd import config as config_mod
    from coordd.daemon.server import Daemon

    cfg = config_mod.load(None, socket=str(tmp_path / "s.sock"), db=str(tmp_path / "c.db"))
    daemon = Daemon(cfg)
    writer = daemon.coord.store.writer
    assert writer.peers() == 0
    daemon.dispatcher._conns.add(object())  # type: ignore[arg-type]
    assert writer.peers() == 1
