"""The store's claim + complete in one process, with and without a fleet-wide limit: the
CPU a limit adds to a job on the writer's thread, without RPC or scheduling noise.

Each variant gets a fresh database of N waiting jobs; one worker claims and completes
them one transaction each (as a batch of one would), timed with process_time.
"""

from __future__ import annotations

import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from coordd.store import jobs, workers
from coordd.store.api import NewJob
from coordd.store.schema import PRAGMAS_WRITER, migrate
from coordd.rules import gates
from coordd.store.sqlite import leases
from coordd.rules.limits import LimitBook, LimitSpec

COOL = '{"memory_used_pct": 40, "temperature_c": 40, "on_battery": false, "user_idle_s": 9999}'
VARIANTS = ("plain", "limited", "unnamed")  # no limits / every job naming one / none naming it


def _one(variant: str, n: int, folder: str) -> float:
    conn = sqlite3.connect(str(Path(folder) / f"{variant}.db"), isolation_level=None)
    try:
        for pragma in PRAGMAS_WRITER:
            conn.execute(pragma)
        migrate(conn)
        book = LimitBook({} if variant == "plain" else {"bench": LimitSpec(concurrency=1000)})
        policy = leases.ClaimPolicy(policies=gates.default_policies(), heartbeat_stale_s=1e9,
                                    aging_interval_s=0.0, limits=book)
        uses = [("bench", 1)] if variant == "limited" else []
        conn.execute("BEGIN")
        for i in range(n):
            jobs.enqueue(conn, 1.0, NewJob(
                job_id=f"j{i:08d}", kind="k", required_role="cpu", priority=1,
                payload_json="{}", run_at=None, max_attempts=3, idempotency_key=None,
                max_runtime_s=None, gates_json=None, limits=uses))
        workers.heartbeat(conn, 1.0, "w", '["cpu"]', COOL)
        conn.execute("COMMIT")
        t0 = time.process_time()
        for _ in range(n):
            conn.execute("BEGIN IMMEDIATE")
            r = leases.claim(conn, 2.0, "w", 30.0, None, policy, '["k"]')
            leases.complete(conn, 2.0, r.job.job_id, "w", r.lease.token, None, None)
            conn.execute("COMMIT")
        return (time.process_time() - t0) / n * 1e6
    finally:
        conn.close()


def store_costs(n: int, rounds: int) -> dict[str, float]:
    """Median CPU microseconds per claim + complete, per variant (rounds interleaved)."""
    got: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-limits-store-") as tmp:
        for r in range(rounds):
            folder = Path(tmp) / str(r)
            folder.mkdir()
            for v in VARIANTS:
                got[v].append(_one(v, n, str(folder)))
    return {v: statistics.median(xs) for v, xs in got.items()}
