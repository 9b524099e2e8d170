"""Job ids: 16 hex characters, time-ordered (ULID-like), strictly increasing per process.

The claim order among jobs queued at the same instant (one `enqueue_batch`, or a pinned
test clock) is by job id (the `jobs_claim` index: ..., priority, queued_at, job_id, ...),
so ids must sort in creation order: FIFO among equals without a sort in the claim query.
"""

from __future__ import annotations

import secrets

COUNTER_BITS = 20  # ids per millisecond before the next millisecond is borrowed
START_BITS = 16    # a fresh millisecond starts at a random counter below 2**16


class JobIds:
    """Make job ids: 44 bits of wall-clock milliseconds then a 20-bit counter, as 16
    lowercase hex characters; each id is greater than the last one made here (if the clock
    stands still or steps back, the counter goes on from the last id).

    The random start of each millisecond's counter keeps ids from two processes (or a
    restart onto a clock that stepped back) from colliding in practice; a collision is
    still caught by the jobs table's primary key.
    """

    def __init__(self) -> None:
        self._last = 0

    def new(self, now: float) -> str:
        """A new id for a job created at `now` (Unix seconds)."""
        base = int(now * 1000) << COUNTER_BITS
        value = max(self._last + 1, base | secrets.randbits(START_BITS))
        self._last = value
        return f"{value:016x}"
