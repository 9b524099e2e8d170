"""The PostgreSQL store (asyncpg): coordd.store.postgres.store.PostgresStore.

Every SQL string of it is in coordd.store.postgres.sql (statements) and .schema
(migrations). asyncpg is an optional dependency (the `postgres` extra): importing this
package without it raises ImportError.
"""

from coordd.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
