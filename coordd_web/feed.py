"""One follower of coordd's event feed per coordd-web process, shared by every SSE stream.

The follower holds the process's only parked `watch_events` (however many tabs are
open) and keeps its last BATCHES_KEPT replies; each stream reads from them after its own
cursor with its own filter. A stream behind them (a resumed tab) catches up with
one-shot calls that never park. Rule: a stream never parks a call of its own at coordd.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from coordd import errors
from coordd.client import Client
from coordd.wire.push import FeedEvent

logger = logging.getLogger(__name__)

WAIT_S = 15.0        # the follower's call parks this long at most
PACE_S = 0.5         # the least time between two feed calls (the follower's, a catch-up's)
DOWN_RETRY_S = 2.0   # coordd unreachable: try again after this
BATCHES_KEPT = 64    # feed replies kept for the streams
FEED_LIMIT = 1000    # events one feed call asks for
DOWN_CODES = frozenset({"disconnected", "timeout", "overloaded", "unavailable"})


@dataclass
class Batch:
    """One feed reply: the events after `start` up to `end` (next_after)."""

    start: int
    end: int
    events: list[FeedEvent]


def matches(ev: FeedEvent, flt: dict[str, Any]) -> bool:
    """Whether `ev` passes a stream's filter (job_id / workflow_id, as coordd's)."""
    return all(getattr(ev, k) == v for k, v in flt.items())


class Feed:
    """The shared follower: started by the first stream, stopped when the last leaves.

    `cursor` is its position in the feed (None until it has one), `up`/`why` whether
    coordd answers, `epoch` counts restarts at a lower head (another database), `seq`
    its news.
    """

    def __init__(self, socket: str | None) -> None:
        self._socket = socket
        self._streams = 0
        self._task: asyncio.Task[None] | None = None
        self._changed: asyncio.Condition | None = None
        self.batches: deque[Batch] = deque(maxlen=BATCHES_KEPT)
        self.cursor: int | None = None
        self.up: bool | None = None
        self.why = ""
        self.epoch = 0
        self.seq = 0  # bumped at each piece of news
        self._closing = asyncio.Event()

    @property
    def closing(self) -> bool:
        """Whether `close` was called: every stream ends at its next step."""
        return self._closing.is_set()

    async def close(self) -> None:
        """End every stream (the server is shutting down): each returns at once instead of
        holding its connection until uvicorn's graceful timeout cancels it."""
        self._closing.set()
        if self._changed is not None:
            await self._notify()

    async def rest(self, seconds: float) -> None:
        """Sleep `seconds`, or less: until `close`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), seconds)

    @property
    def streams(self) -> int:
        """Streams subscribed now."""
        return self._streams

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator["Feed"]:
        """Hold the follower running for one stream."""
        self._streams += 1
        if self._task is None or self._task.done():
            self._changed = asyncio.Condition()
            self.batches.clear()
            self.cursor, self.up = None, None
            self._task = asyncio.create_task(self._follow())
        try:
            yield self
        finally:
            self._streams -= 1
            if self._streams == 0 and self._task is not None:
                task, self._task = self._task, None
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def changed(self, seen: int, timeout: float) -> bool:
        """Wait until the follower has news after `seen` (a `seq`: a reply, up/down) or
        `timeout` passed; whether it has."""
        assert self._changed is not None
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(lambda: self.seq != seen),
                                       timeout)
        return self.seq != seen

    def since(self, after: int, flt: dict[str, Any]) -> list[FeedEvent] | None:
        """Kept events after `after` passing `flt`, in id order; None when the kept
        replies do not reach back to `after` (the stream must catch up itself)."""
        if self.cursor is None or (self.batches and self.batches[0].start > after) \
                or (not self.batches and self.cursor > after):
            return None
        return [ev for b in self.batches if b.end > after for ev in b.events
                if ev.event_id > after and matches(ev, flt)]

    async def _notify(self) -> None:
        assert self._changed is not None
        self.seq += 1
        async with self._changed:
            self._changed.notify_all()

    async def _follow(self) -> None:
        client = Client(self._socket, timeout=WAIT_S + 10)
        try:
            while True:
                try:
                    if self.cursor is None:
                        self.cursor = (await client.call("feed_head", {}))["event_id"]
                    res = await client.watch_events(after=self.cursor, wait_s=WAIT_S,
                                                    limit=FEED_LIMIT)
                except errors.CoordError as exc:
                    if exc.code not in DOWN_CODES:
                        logger.warning("feed: %s: %s (starting again at the head)", exc.code,
                                       exc, extra={"action": "web_feed_error"})
                        self.cursor = None
                    self.up, self.why = False, str(exc)
                    await self._notify()
                    await client.close()
                    await asyncio.sleep(DOWN_RETRY_S)
                    continue
                self.up = True
                if res.next_after < self.cursor:  # another database: from its head
                    self.batches.clear()
                    self.epoch += 1
                elif res.events or res.next_after != self.cursor:
                    self.batches.append(Batch(self.cursor, res.next_after, res.events))
                self.cursor = res.next_after
                await self._notify()
                await asyncio.sleep(PACE_S)
        finally:
            await client.close()
