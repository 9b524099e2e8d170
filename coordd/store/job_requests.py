"""A job's idempotency key and the hash of the request that made it (schema v9).

A job made with a key keeps `request_sha256` (coordd.rules.idempotency.request_hash), so a
repeated key with another request is refused instead of answered with the first job.
Rows from before v9 have none and are not checked: any request with their key is taken as
the same one, as it was when they were stored.
"""

from __future__ import annotations

import sqlite3

from coordd import errors

# Its own step, so that migrations added beside it can be renumbered at a merge.
MIGRATION_JOB_REQUEST_SHA256 = """
    ALTER TABLE jobs ADD COLUMN request_sha256 TEXT
"""

SQL_JOB_BY_KEY = "SELECT job_id, request_sha256 FROM jobs WHERE idempotency_key = ?"


def repeated(conn: sqlite3.Connection, key: str | None, request_sha256: str | None) -> str:
    """The id of the job `key` names, for a repeat of the request that made it.

    Raises:
        errors.InvalidState: that job was made by another request (its hash differs).
    """
    existing, stored = conn.execute(SQL_JOB_BY_KEY, (key,)).fetchone()
    if stored is not None and stored != request_sha256:
        raise errors.InvalidState(
            f"idempotency key {key!r} is taken by job {existing}, made by another request "
            f"(kind, role, priority, payload, run_at/delay_s, max_attempts, max_runtime_s, "
            f"gates or result_schema differ); a repeat must be the same request, a new "
            f"job needs a new key")
    return existing
