"""Stored times moved by a step of the wall clock, so durations keep their real length.

coordd's clock is anchored on the monotonic clock (coordd.clock.AnchoredClock); when the
writer re-anchors it after a wall-clock step (NTP, a manual change, a suspend), this runs
in the same transaction and moves by the same step every stored time that a duration is
measured from or to:

- leases `granted_at`, `expires_at` (lease length, `max_runtime_s`, the claim_id replay
  window): a 30 s lease still ends 30 s after its grant in real time;
- `workers.heartbeat_at`, `agents.heartbeat_at` (heartbeat_stale_s, agent_stale_s);
- waiting jobs' `queued_at` (claim order, aging, workflow_absent_wait_s), and `run_at`
  where coordd chose it as a delay (backoff: a job with attempts spent);
- hub messages' `expires_at` (ttl) and unacked reads' `visible_at` (visibility timeout);
- fleet-wide limits' rate-window claims and budget usage times (coordd.store.limits).

Calendar times stay: a `run_at` a client sent (a job never attempted) and schedule slots
(cron, UTC) mean a time of day, reached earlier or later by the step; only a job that was
due stays due (a step back does not hide it again). History (events, created_at,
finished_at) is not rewritten.
"""

from __future__ import annotations

import sqlite3

from coordd.store import limits as limit_windows

# ?1 step, ?2 coordd's time before the step, ?3 its time at the last look before (the
# suspend grace applies to leases live then), ?4 grant the grace (a jump past clock_jump_s)
SQL_SHIFT_LEASES = (
    "UPDATE leases SET granted_at = granted_at + ?1, expires_at = CASE "
    "WHEN ?4 AND expires_at > ?3 THEN max(expires_at + ?1, ?2 + ?1 + lease_s) "
    "ELSE expires_at + ?1 END"
)
SQL_SHIFT_WORKERS = "UPDATE workers SET heartbeat_at = heartbeat_at + ?"
SQL_SHIFT_AGENTS = "UPDATE agents SET heartbeat_at = heartbeat_at + ?"
# ?1 step, ?2 before, ?3 min(before, after): rows at or below ?3 are due either way;
# updated_at moves with queued_at: a waiting job's updated_at is its queued_at (the
# jobs_ready index of `status` follows both times, coordd.store.latency)
SQL_SHIFT_WAITING = (
    "UPDATE jobs SET queued_at = queued_at + ?1, updated_at = updated_at + ?1, run_at = CASE "
    "WHEN attempts > 0 AND run_at > ?3 THEN run_at + ?1 "
    "WHEN run_at > ?2 + ?1 AND run_at <= ?2 THEN ?2 + ?1 "
    "ELSE run_at END WHERE status = 'waiting'"
)
SQL_SHIFT_MESSAGES = (
    "UPDATE messages SET expires_at = expires_at + ?1 "
    "WHERE expires_at IS NOT NULL AND expires_at > ?2"
)
SQL_SHIFT_READS = (
    "UPDATE message_reads SET visible_at = visible_at + ?1 "
    "WHERE visible_at IS NOT NULL AND visible_at > ?2 AND processed_at IS NULL"
)


def shift_times(conn: sqlite3.Connection, before: float, step: float, seen_at: float,
                grace: bool) -> dict[str, int]:
    """Move the stored times (see the module doc) by `step` seconds; return rows per table.

    Args:
        before: coordd's time at the step (the batch's `now` before re-anchoring).
        step: how far the wall clock moved from coordd's clock (either sign).
        seen_at: coordd's time at its last commit before the step.
        grace: a suspend-sized jump: leases live at `seen_at` also run at least one whole
            `lease_s` from the new time, so the holder's first renewal keeps them.
    """
    low = min(before, before + step)
    return {
        "leases": conn.execute(SQL_SHIFT_LEASES, (step, before, seen_at, grace)).rowcount,
        "workers": conn.execute(SQL_SHIFT_WORKERS, (step,)).rowcount,
        "agents": conn.execute(SQL_SHIFT_AGENTS, (step,)).rowcount,
        "waiting": conn.execute(SQL_SHIFT_WAITING, (step, before, low)).rowcount,
        "messages": conn.execute(SQL_SHIFT_MESSAGES, (step, low)).rowcount,
        "reads": conn.execute(SQL_SHIFT_READS, (step, low)).rowcount,
        "limit windows": limit_windows.shift_times(conn, step),
    }
