"""Time for coordd and the worker: the only module that imports `time`.

`wall()` is Unix seconds (float), used only for values stored or sent; `mono()` is a
monotonic reading in seconds, used for deadlines and intervals. Tests pin time with
`FakeClock`; nothing in coordd sleeps to make time pass.
"""

from __future__ import annotations

import asyncio
import time


class Clock:
    """Interface: wall time, monotonic time, and an interruptible wait."""

    def wall(self) -> float:
        """Return Unix time in seconds."""
        raise NotImplementedError

    def mono(self) -> float:
        """Return a monotonic reading in seconds."""
        raise NotImplementedError

    async def wait(self, stop: asyncio.Event, seconds: float) -> bool:
        """Wait up to `seconds` or until `stop` is set; return True if `stop` is set."""
        raise NotImplementedError


class SystemClock(Clock):
    """The real clock: `time.time()` and `time.monotonic()`."""

    def wall(self) -> float:
        return time.time()

    def mono(self) -> float:
        return time.monotonic()

    async def wait(self, stop: asyncio.Event, seconds: float) -> bool:
        if stop.is_set():
            return True
        try:
            await asyncio.wait_for(stop.wait(), timeout=max(0.0, seconds))
        except TimeoutError:
            return False
        return True


class AnchoredClock(Clock):
    """coordd's own clock: the wall clock read once (the anchor) plus monotonic time since.

    A step of the wall clock (NTP, a manual change) or a suspend (the monotonic clock
    stands still) does not move this clock: leases, heartbeat ages and backoff keep their
    length in real time. `step()` says how far the wall clock has moved away; only the
    writer re-anchors (`shift`), in the same transaction that moves the stored times that
    measure durations by the same step (coordd.timeshift), so readers never see the
    clock and the rows disagree.

    Args:
        base: the clock read (SystemClock in production, FakeClock in tests).
    """

    def __init__(self, base: Clock) -> None:
        self.base = base
        self._anchor_wall = base.wall()
        self._anchor_mono = base.mono()

    def wall(self) -> float:
        return self._anchor_wall + (self.base.mono() - self._anchor_mono)

    def mono(self) -> float:
        return self.base.mono()

    async def wait(self, stop: asyncio.Event, seconds: float) -> bool:
        return await self.base.wait(stop, seconds)

    def step(self) -> float:
        """Seconds the wall clock is ahead of this clock (negative: behind)."""
        return self.base.wall() - self.wall()

    def shift(self, seconds: float) -> None:
        """Move this clock by `seconds` (the writer re-anchoring after a step)."""
        self._anchor_wall += seconds


def anchored(clock: Clock) -> AnchoredClock:
    """`clock` itself if it is an AnchoredClock, else one anchored on it."""
    return clock if isinstance(clock, AnchoredClock) else AnchoredClock(clock)


class FakeClock(Clock):
    """A pinned clock for tests.

    `advance(s)` moves wall and monotonic time together; `jump_wall(s)` moves only the
    wall clock (a suspend/resume or an NTP step). Waiters wake when their deadline passes.
    """

    def __init__(self, start: float = 1_000.0) -> None:
        self._wall = float(start)
        self._mono = 0.0
        self._changed: asyncio.Event | None = None

    def wall(self) -> float:
        return self._wall

    def mono(self) -> float:
        return self._mono

    def set(self, wall: float) -> None:
        """Set wall and monotonic time so that wall equals `wall` (must not go back)."""
        self.advance(wall - self._wall)

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by `seconds` (>= 0)."""
        if seconds < 0:
            raise ValueError("FakeClock cannot go back")
        self._wall += seconds
        self._mono += seconds
        self._notify()

    def jump_wall(self, seconds: float) -> None:
        """Move only the wall clock by `seconds` (a suspend, or an NTP step)."""
        self._wall += seconds
        self._notify()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def wait(self, stop: asyncio.Event, seconds: float) -> bool:
        deadline = self._mono + seconds
        while not stop.is_set() and self._mono < deadline:
            if self._changed is None:
                self._changed = asyncio.Event()
            changed = self._changed
            stop_task = asyncio.ensure_future(stop.wait())
            change_task = asyncio.ensure_future(changed.wait())
            try:
                await asyncio.wait({stop_task, change_task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop_task.cancel()
                change_task.cancel()
        return stop.is_set()
