"""coordd.store.postgres.batch.Batcher with a fake statement: batching, keys, groups, and
a failed statement run again item by item (no database needed)."""

from __future__ import annotations

import asyncio

import pytest

from coordd import errors
from coordd.store.postgres.batch import Batcher


class Statements:
    """A fake flush: records each statement's items; fails a statement holding "bad"."""

    def __init__(self) -> None:
        self.calls: list[tuple[float | None, list[str]]] = []

    async def __call__(self, now: float | None, items: list[str]) -> list[str]:
        self.calls.append((now, list(items)))
        await asyncio.sleep(0)
        if "bad" in items:
            raise ValueError("bad item")
        if "lost" in items:
            raise errors.Unavailable("connection lost")
        return [f"done {i}" for i in items]


async def test_calls_queue_behind_the_statement_in_flight_and_share_the_next():
    st = Statements()
    b = Batcher(st, key=lambda i: i, max_in_flight=1, max_items=3)
    res = await asyncio.gather(*(b.submit(None, f"j{n}") for n in range(6)))
    assert res == [f"done j{n}" for n in range(6)]
    assert [items for _, items in st.calls] == [["j0"], ["j1", "j2", "j3"], ["j4", "j5"]]


async def test_a_failed_statement_is_run_again_item_by_item():
    st = Statements()
    b = Batcher(st, key=lambda i: i, max_in_flight=1)
    res = await asyncio.gather(b.submit(None, "first"), b.submit(None, "bad"),
                               b.submit(None, "ok"), return_exceptions=True)
    assert res[0] == "done first" and res[2] == "done ok" and isinstance(res[1], ValueError)
    assert [items for _, items in st.calls] == [["first"], ["bad", "ok"], ["bad"], ["ok"]]


async def test_a_lost_connection_fails_every_item_of_its_statement_and_runs_none_again():
    st = Statements()
    b = Batcher(st, key=lambda i: i, max_in_flight=1)
    res = await asyncio.wait_for(asyncio.gather(
        b.submit(None, "first"), b.submit(None, "lost"), b.submit(None, "other"),
        return_exceptions=True), timeout=5)
    assert res[0] == "done first"
    assert all(isinstance(r, errors.Unavailable) for r in res[1:])  # it may have committed
    assert [items for _, items in st.calls] == [["first"], ["lost", "other"]]


async def test_one_statement_never_holds_a_key_twice_nor_mixes_now_or_group():
    st = Statements()
    b = Batcher(st, key=lambda i: i.split(":")[0], group=lambda i: i.endswith("!"),
                max_in_flight=1)
    await asyncio.gather(b.submit(None, "x"), b.submit(None, "a:1"), b.submit(None, "a:2"),
                         b.submit(5.0, "b"), b.submit(None, "c!"), b.submit(None, "d"))
    assert st.calls == [(None, ["x"]), (None, ["a:1", "d"]), (None, ["a:2"]),
                        (5.0, ["b"]), (None, ["c!"])]


def test_bounds_are_checked():
    with pytest.raises(ValueError):
        Batcher(Statements(), key=str, max_items=0)


async def test_the_next_statement_starts_before_the_callers_of_the_last_resume():
    """One in flight: when a statement's results are in, the statement of the calls that
    queued meanwhile is sent before the first statement's callers run on (their replies
    overlap it, not delay it)."""
    order: list[str] = []
    release = asyncio.Event()

    async def flush(now: float | None, items: list[str]) -> list[str]:
        order.append("sent " + "+".join(items))
        if items == ["a"]:
            await release.wait()
        return items

    b = Batcher(flush, key=lambda i: i, max_in_flight=1)

    async def caller(item: str) -> None:
        await b.submit(None, item)
        order.append("resumed " + item)

    tasks = [asyncio.create_task(caller(i)) for i in ("a", "b", "c")]
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(*tasks)
    assert order == ["sent a", "sent b+c", "resumed a", "resumed b", "resumed c"]
