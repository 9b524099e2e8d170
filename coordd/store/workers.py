"""A worker's row in the SQLite store: the heartbeat's upsert, incarnations, advertised
kinds, goodbyes and forgetting; leases a worker lost.

A worker sends an `incarnation` (an id per start) in each heartbeat. A heartbeat whose
incarnation differs from the stored one means the worker restarted: every lease still
held under that worker id belonged to the dead predecessor and is ended at once
(`worker_lost`), under the same retry rules as an expired lease. Runs inside the
writer's transaction like the rest of coordd.store.
"""

from __future__ import annotations

import sqlite3

from coordd import errors
from coordd.jsontext import lenient_json
from coordd.store.jobs import end_lost_lease
from coordd.rules.worker_state import WorkerState  # noqa: F401 (re-exported)

WORKER_LOST = "worker_lost"

SQL_INCARNATION = "SELECT incarnation FROM workers WHERE worker_id = ?"
SQL_SET_STATE = (
    "UPDATE workers SET incarnation = ?, kinds_json = ?, broken_kinds_json = ?, "
    "offline_at = NULL WHERE worker_id = ?"
)
SQL_SET_OFFLINE = "UPDATE workers SET offline_at = ? WHERE worker_id = ?"
SQL_WORKER_ROW = "SELECT heartbeat_at, offline_at FROM workers WHERE worker_id = ?"
SQL_DELETE_WORKER = "DELETE FROM workers WHERE worker_id = ?"
SQL_LEASES_OF_WORKER = (
    "SELECT l.job_id, j.attempts, j.max_attempts, j.cancel_requested "
    "FROM leases l JOIN jobs j ON j.job_id = l.job_id WHERE l.worker_id = ? ORDER BY l.job_id"
)
SQL_WORKER_STATES = (
    "SELECT worker_id, incarnation, kinds_json, broken_kinds_json, offline_at FROM workers"
)
SQL_PREEMPTIONS = "SELECT preemptions FROM jobs WHERE job_id = ?"

SQL_HEARTBEAT = (
    "INSERT INTO workers (worker_id, roles_json, heartbeat_json, heartbeat_at, first_seen_at) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (worker_id) DO UPDATE SET "
    "roles_json = excluded.roles_json, heartbeat_json = excluded.heartbeat_json, "
    "heartbeat_at = excluded.heartbeat_at"
)
SQL_CANCEL_REQUESTED_FOR_WORKER = (
    "SELECT l.job_id FROM leases l JOIN jobs j ON j.job_id = l.job_id "
    "WHERE l.worker_id = ? AND j.cancel_requested = 1"
)


def heartbeat(conn: sqlite3.Connection, now: float, worker_id: str, roles_json: str,
              readings_json: str) -> list[str]:
    """Record a heartbeat (coordd's clock); return the ids of jobs this worker holds whose
    cancel was requested. `roles_json` and `readings_json` are encoded by the caller."""
    conn.execute(SQL_HEARTBEAT, (worker_id, roles_json, readings_json, now, now))
    return [r[0] for r in conn.execute(SQL_CANCEL_REQUESTED_FOR_WORKER, (worker_id,))]


def release_worker(conn: sqlite3.Connection, now: float, worker_id: str) -> list[str]:
    """End every lease `worker_id` holds as `worker_lost`; return the job ids."""
    rows = conn.execute(SQL_LEASES_OF_WORKER, (worker_id,)).fetchall()
    for job_id, attempts, max_attempts, cancel in rows:
        end_lost_lease(conn, now, job_id, worker_id, attempts, max_attempts, cancel, WORKER_LOST)
    return [r[0] for r in rows]


def release_predecessor(conn: sqlite3.Connection, now: float, worker_id: str,
                        incarnation: str | None) -> list[str]:
    """A heartbeat from `incarnation`: if the stored incarnation is another one, the
    worker restarted and the leases under its id are its dead predecessor's: end them
    (`worker_lost`). Call before the heartbeat's upsert; returns the released job ids."""
    row = conn.execute(SQL_INCARNATION, (worker_id,)).fetchone()
    if incarnation is None or row is None or row[0] in (None, incarnation):
        return []
    return release_worker(conn, now, worker_id)


def store_state(conn: sqlite3.Connection, worker_id: str, incarnation: str | None,
                kinds_json: str | None, broken_json: str | None) -> None:
    """Write the heartbeat's incarnation and kinds on the (just upserted) worker row."""
    conn.execute(SQL_SET_STATE, (incarnation, kinds_json, broken_json, worker_id))


def goodbye(conn: sqlite3.Connection, now: float, worker_id: str,
            incarnation: str | None) -> list[str]:
    """Mark a worker offline at once (a graceful stop) and end the leases it still holds
    (`worker_lost`). A goodbye from an incarnation other than the stored one (a late one
    from a predecessor) changes nothing. Returns the released job ids.

    Raises:
        errors.NotFound: no such worker.
    """
    row = conn.execute(SQL_INCARNATION, (worker_id,)).fetchone()
    if row is None:
        raise errors.NotFound(f"worker {worker_id} not found")
    if incarnation is not None and row[0] is not None and row[0] != incarnation:
        return []
    conn.execute(SQL_SET_OFFLINE, (now, worker_id))
    return release_worker(conn, now, worker_id)


def forget(conn: sqlite3.Connection, now: float, worker_id: str, stale_s: float,
           force: bool) -> list[str]:
    """Drop a worker's row; its leases end as `worker_lost`. Returns the released job ids.

    Raises:
        errors.NotFound: no such worker.
        errors.InvalidState: it is live (heartbeat within `stale_s`, no goodbye) or holds
            leases, and `force` is not set.
    """
    row = conn.execute(SQL_WORKER_ROW, (worker_id,)).fetchone()
    if row is None:
        raise errors.NotFound(f"worker {worker_id} not found")
    heartbeat_at, offline_at = row
    held = conn.execute(SQL_LEASES_OF_WORKER, (worker_id,)).fetchall()
    if not force:
        check_forget(worker_id, now, heartbeat_at, offline_at, len(held), stale_s)
    lost = release_worker(conn, now, worker_id)
    conn.execute(SQL_DELETE_WORKER, (worker_id,))
    return lost


def check_forget(worker_id: str, now: float, heartbeat_at: float, offline_at: float | None,
                 held: int, stale_s: float) -> None:
    """Refuse to forget, without `force`, a live worker or one holding `held` leases
    (any store). Raises: errors.InvalidState."""
    if offline_at is None and now - heartbeat_at <= stale_s:
        raise errors.InvalidState(
            f"worker {worker_id} is live (heartbeat {max(0.0, now - heartbeat_at):.0f}s "
            "ago); stop it first, or --force")
    if held:
        raise errors.InvalidState(f"worker {worker_id} holds {held} lease(s); "
                                  "--force ends them (worker_lost)")


def worker_states(conn: sqlite3.Connection) -> dict[str, WorkerState]:
    """worker_id -> its WorkerState (stored JSON that does not decode shows as unknown)."""
    return {worker_id: state_of(*row) for worker_id, *row in conn.execute(SQL_WORKER_STATES)}


def state_of(incarnation: str | None, kinds_json: str | None, broken_json: str | None,
             offline_at: float | None) -> WorkerState:
    """A WorkerState from its stored columns (any store), JSON that does not decode as
    unknown."""
    kinds = lenient_json(kinds_json)
    broken = lenient_json(broken_json, {})
    return WorkerState(
        incarnation=incarnation,
        kinds=[k for k in kinds if isinstance(k, str)] if isinstance(kinds, list) else None,
        broken_kinds={str(k): str(v) for k, v in broken.items()}
        if isinstance(broken, dict) else {},
        offline_at=offline_at)


def preemptions(conn: sqlite3.Connection, job_id: str) -> int:
    """How often the job was handed back without spending an attempt (0 if unknown)."""
    row = conn.execute(SQL_PREEMPTIONS, (job_id,)).fetchone()
    return 0 if row is None else row[0]
