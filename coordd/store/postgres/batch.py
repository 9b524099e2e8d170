"""Per-operation batching: PostgreSQL's form of the single writer's group commit.

Callers `submit(now, item)` and await its result. While fewer than `max_in_flight`
statements run, an item is sent at once (a lone caller waits for nothing); past that,
items queue, and the next statement takes up to `max_items` of them (one `unnest()`
statement for the lot). Items of one statement share their `now` (pinned or None) and
their `group` (the statement's other parameters), and never share a key (a second call
on a job goes in a later statement). A statement's slot is free once its results are
in: the next statement starts before its callers resume, so their replies overlap it. A
statement that fails is run again item by item (it changed nothing: one statement is
atomic), so one bad item fails only its caller; a lost connection (`unavailable`: it may
have committed) fails every item, never reruns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from coordd import errors

MAX_ITEMS_DEFAULT = 64
MAX_IN_FLIGHT_DEFAULT = 2

# (now, items) -> one result per item, in order; an Exception instance fails its item only
Flush = Callable[[float | None, list[Any]], Awaitable[list[Any]]]


def _no_group(_item: Any) -> None:
    return None


async def each(flush: Flush, now: float | None, items: list[Any]) -> list[Any]:
    """`flush(now, items)`'s results, or an error per item: a statement (or transaction)
    that fails changed nothing, so each item runs again alone and a bad one fails alone;
    a lost connection (`unavailable`: it may have committed) fails every item, never
    runs again here (each caller decides: a claim looks its claim_id up)."""
    try:
        return await flush(now, items)
    except Exception as exc:
        if len(items) == 1 or isinstance(exc, errors.Unavailable):
            return [exc] * len(items)
        results: list[Any] = []
        for item in items:
            try:
                results += await flush(now, [item])
            except Exception as one:
                results.append(one)
        return results


class Batcher:
    """Collect calls of one operation into statements of up to `max_items` items.

    Args:
        flush: runs one statement for a list of items (see Flush).
        key: an item's job id (two items of one job never share a statement).
        group: what items of one statement must share besides `now` (None: nothing).
        max_items: items per statement at most.
        max_in_flight: statements running at once; more calls wait and batch.
    """

    def __init__(self, flush: Flush, key: Callable[[Any], str], *,
                 group: Callable[[Any], Hashable] | None = None,
                 max_items: int = MAX_ITEMS_DEFAULT,
                 max_in_flight: int = MAX_IN_FLIGHT_DEFAULT) -> None:
        if max_items < 1 or max_in_flight < 1:
            raise ValueError("max_items and max_in_flight must be >= 1")
        self._flush, self._key, self._group = flush, key, group or _no_group
        self._max_items, self._max_in_flight = max_items, max_in_flight
        self._pending: list[tuple[float | None, Any, asyncio.Future[Any]]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.statements = 0  # statements run (for tests and the benchmark)
        self.items = 0

    async def submit(self, now: float | None, item: Any) -> Any:
        """Run `item` in a coming statement; return its result (or raise its error)."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((now, item, fut))
        if len(self._tasks) < self._max_in_flight:
            self._start()
        return await fut

    def _start(self) -> None:
        if not self._pending:
            return
        now, group = self._pending[0][0], self._group(self._pending[0][1])
        batch, rest, seen = [], [], set()
        for entry in self._pending:
            key = self._key(entry[1])
            if (len(batch) < self._max_items and entry[0] == now and key not in seen
                    and self._group(entry[1]) == group):
                batch.append(entry)
                seen.add(key)
            else:
                rest.append(entry)
        self._pending = rest
        task = asyncio.get_running_loop().create_task(self._run(now, batch))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._free(task)

    def _free(self, task: asyncio.Task[Any] | None) -> None:
        """`task`'s statement is over: start what waits, up to `max_in_flight`."""
        self._tasks.discard(task)  # type: ignore[arg-type]
        while self._pending and len(self._tasks) < self._max_in_flight:
            self._start()

    async def _run(self, now: float | None, batch: list[tuple[Any, Any, asyncio.Future[Any]]]
                   ) -> None:
        self.statements += 1
        self.items += len(batch)
        try:
            results = await each(self._flush, now, [item for _, item, _ in batch])
        except BaseException:  # cancelled (the store is closing): so are its callers
            for _, _, fut in batch:
                fut.cancel()
            raise
        self._free(asyncio.current_task())  # (no await below: drain() waits for the results)
        for (_, _, fut), res in zip(batch, results):
            if fut.done():
                continue  # its caller went away; the write stands all the same
            if isinstance(res, BaseException):
                fut.set_exception(res)
            else:
                fut.set_result(res)

    async def drain(self) -> None:
        """Wait until every submitted item has run."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
