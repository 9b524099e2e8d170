"""`python -m bench.store`: the drain (claim + complete) through each store's Python API.

    python -m bench.store [--jobs N] [--clients 1,16] [--rounds R] [--dsn DSN]

In one run, on the same N jobs: SQLiteStore (the single writer), PostgresStore (batched,
and with batching off), and the bare asyncpg SKIP LOCKED loop (coordd.store.postgres.bare)
as PostgreSQL's baseline. PostgreSQL runs in a throwaway cluster with fsync on (or at
--dsn). Clients are asyncio tasks in this process, each its own worker. Prints one table
(medians over rounds; ratios to the bare loop are medians of each round's ratio) with
the command that made it. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from coordd import config as config_mod
from coordd.store.sqlite import leases
from coordd.clock import SystemClock
from coordd.ids import JobIds
from coordd.store.api import NewJob
from coordd.store.api import LeaseRef
from coordd.store.sqlite.store import SQLiteStore

ENQUEUE_CHUNK = 1000


def _policy() -> leases.ClaimPolicy:
    cfg = config_mod.load(None)
    return leases.ClaimPolicy(policies=cfg.policies(), heartbeat_stale_s=cfg.heartbeat_stale_s,
                              aging_interval_s=0.0)


async def drain_store(store: Any, jobs: int, clients: int) -> float:
    """Enqueue `jobs`, then drain them with `clients` claim+complete loops; jobs/s."""
    ids, clock, policy = JobIds(), SystemClock(), _policy()
    for start in range(0, jobs, ENQUEUE_CHUNK):
        await store.enqueue([NewJob(job_id=ids.new(clock.wall()), kind="k", required_role="cpu",
                                    priority=i % 4, payload_json='{"n": 1}', run_at=None,
                                    max_attempts=3, idempotency_key=None, max_runtime_s=None,
                                    gates_json=None) for i in range(min(ENQUEUE_CHUNK, jobs - start))])
    readings = {"memory_used_pct": 10.0, "temperature_c": 40.0, "on_battery": False,
                "user_idle_s": 3600.0}
    for c in range(clients):
        await store.heartbeat(f"w{c}", ["cpu"], readings)
    done = 0

    async def client(c: int) -> None:
        nonlocal done
        worker = f"w{c}"
        while True:
            got = await store.claim(worker, 60.0, policy)
            if got.job is None:
                return
            await store.complete(LeaseRef(got.job.job_id, worker, got.lease.token), '"ok"')
            done += 1
    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    elapsed = time.perf_counter() - t0
    assert done == jobs, f"drained {done} of {jobs}"
    return jobs / elapsed


async def drain_bare(dsn: str, jobs: int, clients: int, eager: bool = False) -> float:
    """The bare asyncpg SKIP LOCKED loop on its own table; jobs/s. `eager`: each complete
    and the next claim in one transaction (one commit per job, as coordd's drain with
    `next`); else each statement commits alone (two commits per job)."""
    import asyncpg
    from coordd.store.postgres import bare
    pool = await asyncpg.create_pool(dsn, min_size=clients, max_size=clients)
    try:
        async with pool.acquire() as conn:
            await conn.execute(bare.SQL_SETUP)
            await conn.execute(bare.SQL_FILL, jobs)
            await conn.execute("ANALYZE bare_jobs")
        done = 0

        async def client(c: int) -> None:
            nonlocal done
            worker = f"w{c}"
            async with pool.acquire() as conn:
                row = await conn.fetchrow(bare.SQL_CLAIM, worker)
                while row is not None:
                    if eager:
                        async with conn.transaction():
                            await conn.execute(bare.SQL_COMPLETE, row[0], worker, row[1],
                                               '"ok"')
                            nxt = await conn.fetchrow(bare.SQL_CLAIM, worker)
                    else:
                        await conn.execute(bare.SQL_COMPLETE, row[0], worker, row[1], '"ok"')
                        nxt = await conn.fetchrow(bare.SQL_CLAIM, worker)
                    row = nxt
                    done += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        elapsed = time.perf_counter() - t0
        assert done == jobs
        async with pool.acquire() as conn:
            await conn.execute(bare.SQL_DROP)
        return jobs / elapsed
    finally:
        await pool.close()


async def run(args: argparse.Namespace) -> dict[str, dict[int, list[float]]]:
    from coordd.store.postgres import PostgresStore
    from coordd.store.postgres.throwaway import Cluster
    cluster = None
    dsn = args.dsn
    if dsn is None:
        cluster = Cluster(fsync=True)
        dsn = cluster.start()
    clients = [int(c) for c in args.clients.split(",")]
    rows: dict[str, dict[int, list[float]]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    try:
        for rnd in range(args.rounds):
            for c in clients:
                db = tmp / f"r{rnd}c{c}.db"
                sq = SQLiteStore(str(db), read_connections=1)
                await sq.start()
                try:
                    rows.setdefault("SQLiteStore (single writer)", {}).setdefault(c, []).append(
                        await drain_store(sq, args.jobs, c))
                finally:
                    await sq.close()
                for label, kw in (("PostgresStore (batched)", {}),
                                  ("PostgresStore (batching off)", {"batch_in_flight": 1024})):
                    pg = PostgresStore(dsn, pool_min=2, pool_max=max(4, c + 2), **kw)
                    await pg.start()
                    await pg.truncate()
                    try:
                        rows.setdefault(label, {}).setdefault(c, []).append(
                            await drain_store(pg, args.jobs, c))
                    finally:
                        await pg.truncate()
                        await pg.close()
                rows.setdefault("bare asyncpg SKIP LOCKED loop", {}).setdefault(c, []).append(
                    await drain_bare(dsn, args.jobs, c))
                print(f"round {rnd + 1}, {c} client(s): "
                      + ", ".join(f"{k} {v[c][-1]:,.0f}" for k, v in rows.items()),
                      file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if cluster is not None:
            cluster.stop()
    return rows


def render(rows: dict[str, dict[int, list[float]]], clients: list[int], argv: list[str]) -> str:
    """The table: jobs/s (median over rounds) per client count, PostgreSQL rows also as a
    ratio to the bare loop (the median of the per-round ratios)."""
    bare = rows["bare asyncpg SKIP LOCKED loop"]
    head = "| store | " + " | ".join(f"{c} client(s) jobs/s" for c in clients) + " |"
    out = [f"$ python -m bench.store {' '.join(argv)}".rstrip(), "", head,
           "|---|" + "---:|" * len(clients)]
    for label, per in rows.items():
        cells = []
        for c in clients:
            v = statistics.median(per[c])
            ratio = statistics.median(x / b for x, b in zip(per[c], bare[c]))
            ratio = f" ({ratio:.2f}x bare)" if "Postgres" in label else ""
            cells.append(f"{v:,.0f}{ratio}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.store", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--clients", default="1,16")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--dsn", default=None, help="an existing PostgreSQL (default: a throwaway cluster)")
    args = p.parse_args(argv)
    rows = uvloop.run(run(args))
    print(render(rows, [int(c) for c in args.clients.split(",")], argv))


if __name__ == "__main__":
    main()
