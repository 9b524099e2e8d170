"""The PostgreSQL store (asyncpg): coordd.store.postgres.store.PostgresStore.

Every SQL string of it is in coordd.store.postgres.sql (statements) and .schema
(migrations). asyncpg is an optional dependency (the `postgres` extra): the modules that
need it import it; `PostgresStore` is imported on first use, so the pure parts (batch,
fencing, sql, throwaway) load without it. May import coordd.store's interface and shared
statements, rules, wire and the base modules; never coordd.store.sqlite.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PostgresStore"]


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":
        from coordd.store.postgres.store import PostgresStore
        return PostgresStore
    raise AttributeError(name)
