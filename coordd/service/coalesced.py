"""One read shared among the callers that ask for it while it runs (`status`, polled by
many clients). Store-neutral: it wraps any coroutine function."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class Coalesced:
    """Share one run of `fn()` among the callers that arrive while a run is in flight.

    A caller arriving during a run waits for the next run, which starts when that one
    ends and answers every caller that arrived meanwhile: each answer is read after its
    caller asked (a client that wrote and then reads sees its write), and a burst of N
    callers costs two runs, not N. For cheap, frequent reads polled by many clients
    (`status`).
    """

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._fn = fn
        self._running = False
        self._next: asyncio.Future[Any] | None = None
        self.runs = 0  # how many times fn ran (tests, metrics)

    async def __call__(self) -> Any:
        if not self._running:
            self._running = True
            try:
                self.runs += 1
                return await self._fn()
            finally:
                self._handover()
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        return await asyncio.shield(self._next)  # one caller's cancel is not the others'

    def _handover(self) -> None:
        waiting, self._next = self._next, None
        if waiting is None:
            self._running = False
            return
        task = asyncio.ensure_future(self._serve(waiting))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _serve(self, fut: asyncio.Future[Any]) -> None:
        try:
            self.runs += 1
            result = await self._fn()
        except BaseException as exc:  # every waiter gets the run's error
            if not fut.done():
                fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            if not fut.done():
                fut.set_result(result)
        finally:
            self._handover()
