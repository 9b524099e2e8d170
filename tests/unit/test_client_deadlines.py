"""The client's call timeouts under one loop timer (coordd.client_wire.Deadlines): each
future still there at its deadline fails with asyncio.TimeoutError, whatever else the
timer holds; a future the timer cannot fail any more does not stop it failing the rest."""

from __future__ import annotations

import asyncio

from coordd.client_wire import Deadlines


def test_a_future_left_behind_on_a_closed_loop_does_not_stop_the_next_loops_deadlines():
    # a call abandoned on a loop that was closed without cancelling it (its `finally`
    # never ran) leaves its reply future in the timer; a client then used on another loop
    # (asyncio.run twice) must still time its own calls out
    deadlines = Deadlines()
    first = asyncio.new_event_loop()
    left = first.create_future()
    left.add_done_callback(lambda _f: None)  # a waiting task's wakeup: failing it needs its loop
    deadlines.add(left, 0.0)
    first.close()

    async def second() -> str:
        fut = asyncio.get_running_loop().create_future()
        deadlines.add(fut, 0.05)
        done, _ = await asyncio.wait([fut], timeout=2)
        return type(fut.exception()).__name__ if done else "still waiting"

    assert asyncio.run(second()) == "TimeoutError"
    assert not left.done()  # its loop is gone: nothing to fail it on


def test_deadlines_fire_in_order_whatever_the_order_they_were_added_in():
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines()
        order: list[str] = []
        futs = {}
        for name, seconds in (("c", 0.15), ("a", 0.05), ("d", 0.15), ("b", 0.1)):
            fut = futs[name] = loop.create_future()
            fut.add_done_callback(lambda f, n=name: order.append(n))
            deadlines.add(fut, seconds)
        deadlines.discard(futs["b"])  # its call ended: its deadline goes
        futs["b"].cancel()
        await asyncio.wait(list(futs.values()), timeout=2)
        for name in "acd":
            assert isinstance(futs[name].exception(), asyncio.TimeoutError)
        return order

    order = asyncio.run(main())
    assert order[:2] == ["b", "a"] and sorted(order[2:]) == ["c", "d"]
