"""The restart grace: at coordd's start every lease still stored runs at least one more of
its own `lease_s` from then (SQLiteStore.restart_grace, run by coordd.daemon.server), so a worker
that reconnects and renews keeps its job rather than losing it to the reaper for coordd's
downtime."""

from __future__ import annotations

import sqlite3

# ?1 coordd's time at start
SQL_RESTART_GRACE = "UPDATE leases SET expires_at = max(expires_at, ?1 + lease_s)"


def restart_grace(conn: sqlite3.Connection, now: float) -> int:
    """Extend every stored lease to at least `now + lease_s`; return how many rows."""
    return conn.execute(SQL_RESTART_GRACE, (now,)).rowcount
