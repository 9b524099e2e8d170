"""Enrolment tokens on PostgreSQL (coordd.store.api_enrol.EnrolStore): its statements and
the mixin PostgresStore inherits. Checks are coordd.store.enrol.usable on the database's
clock; a burn locks the token's row (FOR UPDATE), so of two enrolments racing with one
token the second waits and then finds it used.
"""

from __future__ import annotations

from typing import Any

from coordd import errors
from coordd.store import enrol as estore
from coordd.store.api_enrol import TokenState
from coordd.store.postgres.sql import NOW

TOKEN_GRACE_S = 86400.0  # tokens expired this long ago are dropped when one is made

SQL_ADD_TOKEN = (  # $2 digest, $3 worker, $4 ttl_s
    "WITH p AS (DELETE FROM enrol_tokens WHERE expires_at < "
    f"{NOW} - {TOKEN_GRACE_S}::float8) "
    "INSERT INTO enrol_tokens (token_sha256, worker_id, created_at, expires_at) "
    f"VALUES ($2, $3, {NOW}, {NOW} + $4::float8) RETURNING expires_at"
)
_STATE = (  # one row, with NOW, whether or not the token is known
    "SELECT t.worker_id, t.expires_at, t.used_at, {now} FROM (SELECT 1) one "
    "LEFT JOIN LATERAL (SELECT * FROM enrol_tokens WHERE token_sha256 = $2{lock}) t ON true"
)
SQL_TOKEN_STATE = _STATE.format(now=NOW, lock="")
SQL_TOKEN_LOCK = _STATE.format(now=NOW, lock=" FOR UPDATE")
SQL_USE_TOKEN = (  # $2 digest, $3 serial
    f"UPDATE enrol_tokens SET used_at = {NOW}, serial = $3 "
    "WHERE token_sha256 = $2 AND used_at IS NULL RETURNING 1"
)


def _state(row: Any) -> TokenState | None:
    return None if row[0] is None else (row[0], row[1], row[2])


class EnrolOps:
    """EnrolStore over PostgresStore's pool (`self._conn()`); see the module docstring."""

    _conn: Any

    async def add_token(self, digest: str, worker_id: str, ttl_s: float, *,
                        now: float | None = None) -> float:
        """Store the token's digest on the database's clock; return its expires_at."""
        async with self._conn() as conn:
            return await conn.fetchval(SQL_ADD_TOKEN, now, digest, worker_id, ttl_s)

    async def token_state(self, digest: str, *, now: float | None = None
                          ) -> tuple[TokenState | None, float]:
        """(the token's state or None, the database's now)."""
        async with self._conn() as conn:
            row = await conn.fetchrow(SQL_TOKEN_STATE, now, digest)
        return _state(row), row[3]

    async def burn_token(self, digest: str, serial: str, *, now: float | None = None) -> None:
        """Lock the token, check it (coordd.store.enrol.usable), mark it used.
        Raises: errors.PermissionDenied."""
        async with self._conn() as conn, conn.transaction():
            row = await conn.fetchrow(SQL_TOKEN_LOCK, now, digest)
            estore.usable(_state(row), row[3])
            if await conn.fetchval(SQL_USE_TOKEN, now, digest, serial) is None:
                raise errors.PermissionDenied("enroll: this token was already used")
