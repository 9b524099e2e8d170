"""The two baselines every coordd figure is divided by, measured on the same N jobs.

- `bare_sqlite`: the naive in-process loop. One process, plain `sqlite3`, coordd's own
  schema (`coordd.store.migrate`, i.e. the DDL in `store.MIGRATIONS`) and writer PRAGMAs,
  and coordd's own SQL strings: one `BEGIN IMMEDIATE` transaction per claim (candidate
  through the `jobs_claim` index, take the job, insert the lease, log the event) and one
  per complete (fence check, delete the lease, store the result, log the event). No RPC,
  no asyncio, no gate evaluation.
- `huey`: SqliteHuey (huey's defaults: WAL, its own synchronous setting) with a 2-thread
  consumer running N no-op tasks, in a child process.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import sqlite3
import threading
import time
from pathlib import Path

from coordd import store

ROLE, KIND = "cpu", "bench"
# coordd's statements (coordd.store SQL_*) restated here with fixed bindings, so the
# baseline keeps working while coordd's statements change; same tables, same index.
SQL_ENQUEUE = (
    "INSERT INTO jobs (job_id, kind, required_role, priority, payload_json, status, "
    "max_attempts, run_at, queued_at, created_at, updated_at, idempotency_key, "
    "max_runtime_s, gates_json) VALUES (?, ?, ?, ?, ?, 'waiting', ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (idempotency_key) DO NOTHING RETURNING job_id"
)
SQL_EVENT = (
    "INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
SQL_CANDIDATE = (  # the claim index is led by (required_role, kind) since schema v11
    "SELECT job_id FROM jobs INDEXED BY jobs_claim "
    "WHERE status = 'waiting' AND required_role = ? AND kind = ? AND priority = ? "
    "AND run_at <= ? ORDER BY queued_at, job_id LIMIT 1"
)
SQL_TAKE = (
    "UPDATE jobs SET status = 'running', attempts = attempts + 1, "
    "last_token = last_token + 1, updated_at = ? WHERE job_id = ? AND status = 'waiting' "
    "RETURNING last_token"
)
SQL_INSERT_LEASE = (
    "INSERT INTO leases (job_id, worker_id, token, claim_id, granted_at, expires_at, lease_s) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
SQL_LEASE_CHECK = (
    "SELECT j.status, l.worker_id, l.token, l.expires_at FROM jobs j "
    "LEFT JOIN leases l ON l.job_id = j.job_id WHERE j.job_id = ?"
)
SQL_DELETE_LEASE = "DELETE FROM leases WHERE job_id = ?"
SQL_SUCCEED = (
    "UPDATE jobs SET status = 'succeeded', result_json = ?, artifact_sha256 = ?, "
    "updated_at = ?, finished_at = ? WHERE job_id = ?"
)
LEASE_S = 30.0
ENQUEUE_BATCH = 500


def connect(path: str) -> sqlite3.Connection:
    """A plain connection on `path` with coordd's writer PRAGMAs and schema."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 10000")
    for pragma in store.PRAGMAS_WRITER:
        conn.execute(pragma)
    store.migrate(conn)
    return conn


def _job_row(i: int, now: float) -> tuple:
    return (f"b{i:08x}", "bench", "cpu", 1, store.dumps({"i": i}), 3, now, now, now, now,
            None, None, None)


def insert(conn: sqlite3.Connection, i: int, now: float) -> None:
    """Enqueue bare job `i` (and its event), in the caller's transaction."""
    conn.execute(SQL_ENQUEUE, _job_row(i, now)).fetchone()
    conn.execute(SQL_EVENT, (f"b{i:08x}", now, None, None, "waiting", "enqueued"))


def claim_in(conn: sqlite3.Connection, worker_id: str, now: float) -> tuple[str, int] | None:
    """The bare claim's statements, in the caller's open transaction: (job_id, token)."""
    job_id = None
    for prio in (0, 1, 2, 3):
        row = conn.execute(SQL_CANDIDATE, (ROLE, KIND, prio, now)).fetchone()
        if row is not None:
            job_id = row[0]
            break
    if job_id is None:
        return None
    token = conn.execute(SQL_TAKE, (now, job_id)).fetchone()[0]
    conn.execute(SQL_INSERT_LEASE, (job_id, worker_id, token, None, now, now + LEASE_S, LEASE_S))
    conn.execute(SQL_EVENT, (job_id, now, worker_id, "waiting", "running",
                             f"claimed (token {token})"))
    return job_id, token


def complete_in(conn: sqlite3.Connection, worker_id: str, job_id: str, token: int,
                now: float) -> None:
    """The bare complete's statements (fence check first), in the caller's open transaction."""
    row = conn.execute(SQL_LEASE_CHECK, (job_id,)).fetchone()
    if row[1] != worker_id or row[2] != token or now >= row[3]:
        raise RuntimeError(f"bare baseline: lease check failed for {job_id}")
    conn.execute(SQL_DELETE_LEASE, (job_id,))
    conn.execute(SQL_SUCCEED, (None, None, now, now, job_id))
    conn.execute(SQL_EVENT, (job_id, now, worker_id, "running", "succeeded", None))


def claim(conn: sqlite3.Connection, worker_id: str) -> tuple[str, int] | None:
    """One bare claim in its own BEGIN IMMEDIATE transaction: (job_id, token) or None."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        got = claim_in(conn, worker_id, time.time())
        conn.execute("COMMIT")
        return got
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def complete(conn: sqlite3.Connection, worker_id: str, job_id: str, token: int) -> None:
    """One bare complete (fence check first) in its own BEGIN IMMEDIATE transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        complete_in(conn, worker_id, job_id, token, time.time())
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def bare_sqlite(workdir: Path, n: int) -> dict:
    """Enqueue (per-op and batched) then drain N jobs with one transaction per operation."""
    conn = connect(str(workdir / "bare.db"))
    n_single = n // 2
    t0 = time.perf_counter()
    for i in range(n_single):
        conn.execute("BEGIN IMMEDIATE")
        insert(conn, i, time.time())
        conn.execute("COMMIT")
    t1 = time.perf_counter()
    for lo in range(n_single, n, ENQUEUE_BATCH):
        conn.execute("BEGIN IMMEDIATE")
        now = time.time()
        for i in range(lo, min(n, lo + ENQUEUE_BATCH)):
            insert(conn, i, now)
        conn.execute("COMMIT")
    t2 = time.perf_counter()
    lat: list[float] = []
    done = 0
    cpu0 = _cpu()
    t3 = time.perf_counter()
    while True:
        a = time.perf_counter()
        got = claim(conn, "bare-0")
        lat.append(time.perf_counter() - a)
        if got is None:
            break
        complete(conn, "bare-0", *got)
        done += 1
    t4 = time.perf_counter()
    cpu = _cpu() - cpu0
    conn.close()
    if done != n:
        raise RuntimeError(f"bare baseline drained {done} of {n}")
    return {"enqueue_per_op_jobs_s": n_single / (t1 - t0),
            "enqueue_batch_jobs_s": (n - n_single) / (t2 - t1) if n > n_single else None,
            "drain_jobs_s": n / (t4 - t3), "claim_lat": lat[:-1], "cpu_s": cpu}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _huey_child(path: str, n: int, out) -> None:  # type: ignore[no-untyped-def]
    import logging

    from huey import SqliteHuey
    from huey.signals import SIGNAL_COMPLETE, SIGNAL_ERROR

    logging.getLogger("huey").setLevel(logging.ERROR)
    huey = SqliteHuey("bench", filename=path)
    done = threading.Event()
    count = [0, 0]
    lock = threading.Lock()

    @huey.task()
    def noop(i: int) -> None:
        return None

    @huey.signal(SIGNAL_COMPLETE, SIGNAL_ERROR)
    def finished(signal, task, *args, **kw):  # type: ignore[no-untyped-def]
        with lock:
            count[0] += 1
            count[1] += signal == SIGNAL_ERROR
            if count[0] >= n:
                done.set()

    t0 = time.perf_counter()
    for i in range(n):
        noop(i)
    t1 = time.perf_counter()
    cpu0 = _cpu()
    consumer = huey.create_consumer(workers=2, worker_type="thread", periodic=False,
                                    check_worker_health=False)
    t2 = time.perf_counter()
    consumer.start()
    ok = done.wait(600)
    t3 = time.perf_counter()
    cpu = _cpu() - cpu0
    consumer.stop(graceful=True)
    out.put({"ok": ok and count[1] == 0, "enqueue_jobs_s": n / (t1 - t0),
             "drain_jobs_s": count[0] / (t3 - t2), "end_to_end_jobs_s": count[0] / (t3 - t0),
             "cpu_s": cpu, "errors": count[1]})


def huey_available() -> bool:
    try:
        import huey  # noqa: F401
    except ImportError:
        return False
    return True


def huey_sqlite(workdir: Path, n: int) -> dict | None:
    """N no-op tasks through SqliteHuey: enqueue all, then a 2-thread consumer drains them."""
    if not huey_available():
        return None
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_huey_child, args=(str(workdir / "huey.db"), n, out), daemon=True)
    p.start()
    try:
        res = out.get(timeout=900)
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
    if not res["ok"]:
        raise RuntimeError(f"huey baseline failed: {res}")
    return res
