"""Small asyncio and signal helpers of the supervisor (no state, no I/O)."""

from __future__ import annotations

import asyncio
import signal
from typing import Any


async def wait_any(*events: asyncio.Event, future: asyncio.Future[Any] | None = None) -> None:
    """Return when any of `events` is set or `future` is done (the future is not cancelled)."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait([*waiters, *([future] if future else [])],
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


def signame(num: int) -> str:
    """`SIGKILL` for 9; `signal N` for a number with no name."""
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
