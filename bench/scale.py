"""Scale: claim latency, DB bytes per job and coordd RSS with 1k .. 1M waiting jobs.

For each size: start coordd once on a fresh file (it creates the real schema), stop it,
preload the waiting jobs (and their `enqueued` event rows, as enqueue writes them) with
`executemany` in plain sqlite3, then start coordd again and time claims from one client
connection (claim -> complete, sequential; the first WARMUP claims are not counted).
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from bench.daemon import Daemon, pct
from bench.load import run_phase
from bench.baselines import SQL_ENQUEUE, SQL_EVENT
from coordd import store

WARMUP = 50
CLAIMS = 1000
CHUNK = 100_000


def preload(db: str, n: int) -> float:
    """Insert n waiting jobs (oldest first) straight into the file; return seconds taken."""
    t0 = time.perf_counter()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    base = time.time() - n * 1e-3 - 60
    conn.execute("BEGIN IMMEDIATE")
    for lo in range(0, n, CHUNK):
        ids = range(lo, min(n, lo + CHUNK))
        conn.executemany(SQL_ENQUEUE, (
            (f"s{i:09x}", "bench", "cpu", 1, store.dumps({"i": i}), 3, base + i * 1e-3,
             base + i * 1e-3, base + i * 1e-3, base + i * 1e-3, None, None, None)
            for i in ids))
        conn.executemany(SQL_EVENT, (
            (f"s{i:09x}", base + i * 1e-3, None, None, "waiting", "enqueued") for i in ids))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return time.perf_counter() - t0


def _db_bytes(db: str) -> int:
    return sum(os.path.getsize(p) for p in (db, db + "-wal") if os.path.exists(p))


def scale_point(workdir: Path, n: int, probe: bool) -> dict:
    """Claim latency p50/p99, DB bytes per job and coordd RSS with n waiting jobs."""
    d = Daemon(workdir / f"scale{n}", probe=probe)
    d.workdir.mkdir(parents=True)
    d.start()
    d.stop()
    load_s = preload(d.db, n)
    db_bytes = _db_bytes(d.db)
    d.start()
    try:
        run_phase("drain", d.socket, 1, 1, tag="warm", limit=WARMUP)
        r = run_phase("drain", d.socket, 1, 1, tag="scale", limit=CLAIMS)
        rss, peak = d.rss_mb()
    finally:
        d.stop()
    lat = list(r.claim_lat)
    return {"waiting_jobs": n, "preload_s": load_s, "db_bytes": db_bytes,
            "db_bytes_per_job": db_bytes / n, "claims": len(lat),
            "claim_ms_p50": 1e3 * pct(lat, 50), "claim_ms_p99": 1e3 * pct(lat, 99),
            "coordd_rss_mb": rss, "coordd_peak_rss_mb": peak}
