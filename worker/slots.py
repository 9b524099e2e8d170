"""A worker's slots per kind: how many of a kind's jobs run their model at once.

A job takes its kind's slot before it starts its model and gives it back once, either when
its run ends or as soon as its report's next claim (eager dispatch) hands the slot on: the
model has exited by then, so the job that report brought starts at once instead of waiting
for the leaving run's last steps (without that, the new run waited for a slot and every
report sent meanwhile asked for no next job).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from worker.jobrun import JobRun
from worker.waits import wait_any


class Slots:
    """The slots of each kind in use (`kinds`: the configured kind names)."""

    def __init__(self, kinds: Iterable[str]) -> None:
        self._busy: dict[str, int] = {name: 0 for name in kinds}
        self._freed = asyncio.Event()

    async def acquire(self, run: JobRun, slots: int) -> bool:
        """Take a slot of `run`'s kind (`slots` in all), waiting while all are taken:
        True once held, False if `run` was aborted first."""
        name = run.job.kind
        run.waiting_for_slot = True
        try:
            while self._busy[name] >= slots:
                if run.aborted.is_set():
                    return False
                await wait_any(self._freed, run.aborted)
            if run.aborted.is_set():
                return False
            self._busy[name] += 1
            run.holds_slot = True
            return True
        finally:
            run.waiting_for_slot = False

    def release(self, run: JobRun) -> None:
        """Give back `run`'s slot, if it holds one (a second call does nothing)."""
        if run.holds_slot:
            run.holds_slot = False
            self._busy[run.job.kind] -= 1
            self._freed.set()
            self._freed = asyncio.Event()
