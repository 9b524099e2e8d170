"""Queue latency: how long the oldest runnable waiting job has waited since it became
runnable, read off one index.

A waiting job becomes runnable at `ready = max(queued_at, run_at)`: when it entered
waiting (enqueue, a requeue, a hand-back, a workflow promotion) or, if later, when its
backoff or schedule ends. `status` reports now - the smallest `ready` among waiting jobs
that are due (`ready <= now`): Sidekiq's queue latency (now - the enqueue time of the
oldest job in the queue; a retry or a scheduled job enters the queue when it is due).
The partial expression index `jobs_ready` makes it one seek at any queue size.
"""

from __future__ import annotations

# The ready-time index migration (this session's "queue latency" item): its own step,
# renumbered at merge if others add migrations first.
MIGRATION_READY_INDEX = """
    CREATE INDEX jobs_ready ON jobs (max(queued_at, run_at)) WHERE status = 'waiting'
"""

# ?1 now: the smallest ready time among due waiting jobs (NULL: none is due).
SQL_OLDEST_READY = (
    "SELECT min(max(queued_at, run_at)) FROM jobs INDEXED BY jobs_ready "
    "WHERE status = 'waiting' AND max(queued_at, run_at) <= ?1"
)
