"""The writer's two queues (overload by class, issue 21): new work, and holder calls plus
coordd's own maintenance, each bounded apart; a batch takes the urgent lane first.

Holder calls (heartbeat, renew, checkpoint, complete, fail, release) are submitted with
`urgent=True`; a task inside `maintenance()` (and the tasks it starts) submits urgent too.
The rule not to break: an enqueue flood that fills its lane neither refuses nor delays a
renewal.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

from coordd import errors

WriteOp = Callable[[Any, float], Any]
Queued = tuple[WriteOp, "asyncio.Future[Any]", float]  # op, its future, submitted (mono s)
_MAINTENANCE: contextvars.ContextVar[bool] = contextvars.ContextVar("coordd_maintenance",
                                                                    default=False)


@contextlib.contextmanager
def maintenance() -> Iterator[None]:
    """Within this block (and the tasks it starts), this task's submits go in the urgent
    lane: coordd's own rounds are not refused with the producers' work."""
    token = _MAINTENANCE.set(True)
    try:
        yield
    finally:
        _MAINTENANCE.reset(token)


class Lanes:
    """New work and urgent requests, `queue_max` each at most."""

    def __init__(self, queue_max: int) -> None:
        self.queue_max = queue_max
        self.new: collections.deque[Queued] = collections.deque()
        self.urgent: collections.deque[Queued] = collections.deque()

    def __len__(self) -> int:
        return len(self.new) + len(self.urgent)

    def add(self, item: Queued, urgent: bool) -> None:
        """Queue `item` in its lane (urgent: asked, or inside `maintenance()`).

        Raises:
            errors.Overloaded: that lane already holds `queue_max` requests.
        """
        lane = self.urgent if urgent or _MAINTENANCE.get() else self.new
        if len(lane) >= self.queue_max:
            what = "holder and maintenance" if lane is self.urgent else "new work"
            raise errors.Overloaded(f"writer queue full ({self.queue_max} {what} requests)")
        lane.append(item)

    def take(self, most: int) -> list[Queued]:
        """Up to `most` requests for the next batch, the urgent lane first."""
        urgent, new = self.urgent, self.new
        batch = [urgent.popleft() for _ in range(min(most, len(urgent)))]
        if len(batch) < most:
            batch += [new.popleft() for _ in range(min(most - len(batch), len(new)))]
        return batch
