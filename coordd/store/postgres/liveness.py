"""Quiet heartbeats on PostgreSQL (coordd.store.api_governance `touch_workers`,
`liveness_grace`): the batch of last-seen times coordd kept in memory, and the restart
grace's liveness part (coordd.rules.governance_beat says why both keep liveness exact).
The times are the database's clock: a batch sends ages, and the statement subtracts them
from its own now."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coordd.jsontext import dumps
from coordd.store.postgres.sql import NOW

SQL_TOUCH_WORKERS = (  # $1 pinned now or NULL, $2 worker ids, $3 ages (s), $4 readings
    # JSON or NULL (keep the stored); returns now
    f"WITH u AS (UPDATE workers w SET heartbeat_at = greatest(w.heartbeat_at, {NOW} - v.age), "
    "heartbeat_json = coalesce(v.readings, w.heartbeat_json) "
    "FROM unnest($2::text[], $3::float8[], $4::text[]) AS v(id, age, readings) "
    f"WHERE w.worker_id = v.id RETURNING 1) SELECT {NOW}, (SELECT count(*) FROM u)"
)
SQL_LIVENESS_GRACE = (  # $1 pinned now or NULL, $2 bound_s, $3 stale_s
    f"WITH g AS (UPDATE workers SET heartbeat_at = least({NOW}, heartbeat_at + $2) "
    f"WHERE offline_at IS NULL AND heartbeat_at < {NOW} "
    f"AND heartbeat_at > {NOW} - $3::float8 - $2::float8 RETURNING 1) SELECT count(*) FROM g"
)


class LivenessPostgres:
    """Mixed into PostgresStore through GovernancePostgres (its `_conn`, `_preempt`)."""

    _conn: Any
    _preempt: Any

    async def touch_workers(self, seen: Sequence[tuple[str, float, dict[str, Any] | None]],
                            gov: Any, *, now: float | None = None
                            ) -> list[tuple[str, str, str]]:
        """The batch in one statement (its own transaction), then preemption (paced) in
        another, as a heartbeat runs it."""
        async with self._conn() as conn:
            t, _ = await conn.fetchrow(
                SQL_TOUCH_WORKERS, now, [w for w, _, _ in seen], [age for _, age, _ in seen],
                [None if r is None else dumps(r) for _, _, r in seen])
            async with conn.transaction():
                return await self._preempt(conn, now, t, gov)  # type: ignore[no-any-return]

    async def liveness_grace(self, bound_s: float, stale_s: float, *,
                             now: float | None = None) -> int:
        """The restart grace's liveness part in one statement; how many workers."""
        async with self._conn() as conn:
            return int(await conn.fetchval(SQL_LIVENESS_GRACE, now, bound_s, stale_s))
