"""The restart grace on PostgreSQL: when a coordd starts serving (a restart, or a standby
taking over), every stored lease runs at least one more of its own `lease_s` from then
(coordd.store.grace is the SQLite form), so a worker that reconnects and renews keeps its
job rather than losing it to the reaper for the time no coordd answered."""

from __future__ import annotations

from typing import Any

from coordd.store.postgres.sql import NOW

SQL_RESTART_GRACE = (  # $1 pinned now or NULL
    f"WITH g AS (UPDATE leases SET expires_at = greatest(expires_at, {NOW} + lease_s) "
    "RETURNING 1) SELECT count(*) FROM g")


async def restart_grace(conn: Any, now: float | None) -> int:
    """Extend every stored lease to at least now + lease_s; return how many."""
    return int(await conn.fetchval(SQL_RESTART_GRACE, now))
