"""Enrolment tokens: the `enrol_tokens` table, its migration and every statement.

Only a token's SHA-256 is stored; a token is used at most once (`used_at`), inside the
writer's transaction, so two enrolments racing with one token cannot both pass.
"""

from __future__ import annotations

import sqlite3

from coordd import errors
from coordd.rules.times import fmt_time

MIGRATION_ENROL_TOKENS = """
CREATE TABLE enrol_tokens (
    token_sha256 TEXT PRIMARY KEY,
    worker_id    TEXT NOT NULL,
    created_at   REAL NOT NULL,
    expires_at   REAL NOT NULL,
    used_at      REAL,
    serial       TEXT
)
"""

SQL_INSERT_TOKEN = ("INSERT INTO enrol_tokens (token_sha256, worker_id, created_at, expires_at) "
                    "VALUES (?, ?, ?, ?)")
SQL_GET_TOKEN = "SELECT worker_id, expires_at, used_at FROM enrol_tokens WHERE token_sha256 = ?"
SQL_USE_TOKEN = ("UPDATE enrol_tokens SET used_at = ?, serial = ? "
                 "WHERE token_sha256 = ? AND used_at IS NULL")
SQL_PRUNE_TOKENS = "DELETE FROM enrol_tokens WHERE expires_at < ?"


def add_token(conn: sqlite3.Connection, now: float, digest: str, worker_id: str,
              expires_at: float) -> None:
    """Store a new token's digest (tokens expired a day ago are dropped on the way)."""
    conn.execute(SQL_PRUNE_TOKENS, (now - 86400.0,))
    conn.execute(SQL_INSERT_TOKEN, (digest, worker_id, now, expires_at))


def token_state(conn: sqlite3.Connection, digest: str) -> tuple[str, float, float | None] | None:
    """(worker_id, expires_at, used_at) of a token digest, or None if unknown."""
    row = conn.execute(SQL_GET_TOKEN, (digest,)).fetchone()
    return None if row is None else (row[0], row[1], row[2])


def use_token(conn: sqlite3.Connection, now: float, digest: str, serial: str) -> bool:
    """Mark the token used (by the certificate `serial`); False if it already was."""
    return conn.execute(SQL_USE_TOKEN, (now, serial, digest)).rowcount == 1


def usable(state: tuple[str, float, float | None] | None, now: float) -> str:
    """The token's worker id, if a token in `state` (token_state's) is usable at `now`.
    Pure (both stores). Raises: errors.PermissionDenied (unknown, used, expired)."""
    if state is None:
        raise errors.PermissionDenied("enroll: unknown token")
    worker_id, expires_at, used_at = state
    if used_at is not None:
        raise errors.PermissionDenied(f"enroll: this token was already used "
                                      f"({fmt_time(used_at)}); ask for a new one")
    if now >= expires_at:
        raise errors.PermissionDenied(f"enroll: this token expired {fmt_time(expires_at)}")
    return worker_id
