"""The PostgreSQL store at fleet scale (issue 28): the admission claim, `status` and
worker_absent's look behind many waiting jobs.

    python -m bench.pg_scale [--waiting 100000] [--samples 100]

On a throwaway cluster, a PostgresStore (the store interface, no daemon), a worker of
role `cpu` claims one job of its role at a time (enqueued, then claimed, `--samples`
times) on the admission path (a job asked for resources and a fleet limit is defined:
coordd.store.postgres.admission), first on an empty queue, then after `--waiting` jobs of
role `gpu` were inserted ahead of them (queued earlier, the table VACUUMed and ANALYZEd:
no autovacuum of the fill runs while the claims are timed), and with none of its role
left (the refusal). Then
`status` and `workflow_skip_absent` (`--samples` each) with those jobs waiting. Prints
the p50s (issue 28's targets: the claim behind <= 1.5x empty; status <= 5 ms).

    python -m bench.pg_scale --counts-ab [--jobs 2000] [--clients 8] [--rounds 3]

The cost of status's counters (schema MIGRATION_JOB_COUNTS: a trigger on every write of
`jobs`): `--jobs` jobs enqueued, then drained by `--clients` tasks looping plain claim ->
complete through one PostgresStore, with the counters' triggers on and off, alternating
for `--rounds` rounds. Prints each side's median jobs/s.

    python -m bench.pg_scale --fleet [--parked 500] [--beats 1000] [--window-s 20]

Through a real coordd on the cluster (bench.pg_fleet): the CPU of `--parked` idle workers'
parked claims (coordd + postgres, % of one core; target <= 2%), `--beats` workers
heartbeating every 5 s for the window (target: all answered, 200/s at 1,000), then the
same with a parked claim each, and prune keeping the tables bounded (rows and sizes after
each of `--prune-cycles` cycles of `--prune-jobs` jobs).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from coordd import config as config_mod
from coordd.ids import JobIds
from coordd.store.sqlite.leases import ClaimPolicy
from coordd.rules.limits import LimitBook, LimitSpec
from coordd.rules.resources import Request
from coordd.store.api import NewJob

COOL = {"memory_used_pct": 40.0, "temperature_c": 50.0, "on_battery": False,
        "user_idle_s": 3600.0, "gpu_devices": [{"index": 0, "memory_total_mb": 24000.0,
                                                "memory_used_mb": 0.0}], "ram_mb": 64000}
SQL_FILL = (  # $1 how many, $2 role: waiting jobs queued before any other
    "INSERT INTO jobs (job_id, kind, required_role, priority, payload_json, status, "
    "max_attempts, run_at, queued_at, created_at, updated_at) SELECT 'z' || "
    "lpad(g::text, 12, '0'), 'k', $2, 1 + g % 3, '{}', 'waiting', 3, 0, 1, 1, 1 "
    "FROM generate_series(1, $1) g"
)


def _job(ids: JobIds, role: str, **kw: Any) -> NewJob:
    return NewJob(job_id=ids.new(time.time()), kind="k", required_role=role, priority=2,
                  payload_json="{}", run_at=None, max_attempts=3, idempotency_key=None,
                  max_runtime_s=None, gates_json=None, **kw)


async def _p50(n: int, call: Callable[[], Awaitable[object]]) -> float:
    took = []
    for _ in range(n):
        t = time.perf_counter()
        await call()
        took.append(time.perf_counter() - t)
    return statistics.median(took) * 1000


async def _claims(st: Any, policy: ClaimPolicy, ids: JobIds, n: int) -> float:
    """p50 ms of `n` claims, each of a job of the worker's role just enqueued."""
    from coordd.store.api import LeaseRef
    took = []
    for _ in range(n):
        await st.enqueue([_job(ids, "cpu", limits=[("api", 1)])])
        t = time.perf_counter()
        got = await st.claim("w", 30.0, policy)
        took.append(time.perf_counter() - t)
        assert got.job is not None, got
        await st.complete(LeaseRef(got.job.job_id, "w", got.lease.token), None)
    return statistics.median(took) * 1000


async def run(args: argparse.Namespace) -> None:
    from coordd.store.postgres import PostgresStore
    from coordd.store.postgres.throwaway import Cluster
    cfg = config_mod.load(None)
    policy = ClaimPolicy(policies=cfg.policies(), heartbeat_stale_s=3600.0,
                         aging_interval_s=0.0,
                         limits=LimitBook({"api": LimitSpec(concurrency=100)}))
    cluster = Cluster(port=args.port)
    dsn = cluster.start()
    try:
        st = PostgresStore(dsn)
        await st.start()
        ids = JobIds()
        await st.enqueue([_job(ids, "gpu", resources=Request(gpus=1))])  # resources seen
        await st.heartbeat("w", ["cpu"], COOL)
        empty = await _claims(st, policy, ids, args.samples)
        async with st._conn() as conn:
            await conn.execute(SQL_FILL, args.waiting, "gpu")
            await conn.execute("VACUUM (ANALYZE)")  # not autovacuum mid-measure
        behind = await _claims(st, policy, ids, args.samples)
        none = await _p50(args.samples, lambda: st.claim("w", 30.0, policy))  # none of its role
        status = await _p50(args.samples, lambda: st.status(30.0))
        absent = await _p50(args.samples, lambda: st.workflow_skip_absent(600.0, 30.0))
        await st.close()
    finally:
        cluster.stop()
    print(f"admission claim p50: empty {empty:.2f} ms, behind {args.waiting} waiting of "
          f"another role {behind:.2f} ms ({behind / empty:.2f}x); with none of its role "
          f"{none:.2f} ms")
    print(f"status p50 {status:.2f} ms, workflow_skip_absent p50 {absent:.2f} ms "
          f"({args.waiting} waiting)")


TRIGGERS = ("job_counts_insert", "jobs_updated", "job_counts_delete")


async def _drain(st: Any, policy: ClaimPolicy, ids: JobIds, jobs: int, clients: int) -> float:
    """Enqueue `jobs`, drain them with `clients` claim -> complete loops; jobs/s."""
    from coordd.store.api import LeaseRef
    for i in range(0, jobs, 500):
        await st.enqueue([_job(ids, "cpu") for _ in range(min(500, jobs - i))])

    async def client(k: int) -> None:
        await st.heartbeat(f"w{k}", ["cpu"], COOL)
        while True:
            got = await st.claim(f"w{k}", 30.0, policy)
            if got.job is None:
                return
            await st.complete(LeaseRef(got.job.job_id, f"w{k}", got.lease.token), None)

    t = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    return jobs / (time.perf_counter() - t)


async def counts_ab(args: argparse.Namespace) -> None:
    from coordd.store.postgres import PostgresStore
    from coordd.store.postgres.throwaway import Cluster
    cfg = config_mod.load(None)
    policy = ClaimPolicy(policies=cfg.policies(), heartbeat_stale_s=3600.0,
                         aging_interval_s=0.0)
    cluster = Cluster(port=args.port)
    dsn = cluster.start()
    rates: dict[str, list[float]] = {"on": [], "off": []}
    try:
        st = PostgresStore(dsn, pool_max=args.clients + 2)
        await st.start()
        ids = JobIds()
        for _ in range(args.rounds):
            for side in ("on", "off"):
                async with st._conn() as conn:
                    for name in TRIGGERS:
                        verb = "ENABLE" if side == "on" else "DISABLE"
                        await conn.execute(f"ALTER TABLE jobs {verb} TRIGGER {name}")
                rates[side].append(await _drain(st, policy, ids, args.jobs, args.clients))
        await st.close()
    finally:
        cluster.stop()
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    print(f"drain of {args.jobs} jobs by {args.clients} clients, median of {args.rounds}: "
          f"counters on {on:.0f} jobs/s, off {off:.0f} jobs/s ({on / off:.2f}x)")


async def fleet(args: argparse.Namespace) -> None:
    from bench import pg_fleet
    from bench.drain_stores import _database, fresh_database
    from coordd.store.postgres.throwaway import Cluster
    cluster = Cluster(port=args.port)
    dsn = cluster.start()
    try:
        for step in ("parked", "beats", "beats+parked", "prune"):
            name, db = await asyncio.to_thread(fresh_database, dsn)
            if step == "parked" and args.parked:
                r = await pg_fleet.parked(cluster, db, args.parked, args.window_s)
                print(f"{args.parked} parked claims, {args.window_s:g} s: coordd "
                      f"{r['coordd_pct']:.2f}% + postgres {r['postgres_pct']:.2f}% = "
                      f"{r['coordd_pct'] + r['postgres_pct']:.2f}% of one core "
                      f"({r['answered_early']:.0f} answered early)", flush=True)
            elif step.startswith("beats") and args.beats:
                park = step == "beats+parked"
                r = await pg_fleet.heartbeats(db, args.beats, 5.0, args.window_s, park)
                print(f"{args.beats} workers heartbeating every 5 s"
                      f"{', each with a parked claim' if park else ''}, {args.window_s:g} s: "
                      f"{r['answered']:.0f} of {r['sent']:.0f} answered "
                      f"({r['per_s']:.1f}/s of {r['target_per_s']:.0f}/s), "
                      f"{r['refused']:.0f} refused, p50 {r['p50_ms']:.2f} ms, "
                      f"p99 {r['p99_ms']:.2f} ms", flush=True)
            elif step == "prune" and args.prune_cycles:
                rows = await pg_fleet.prune(db, args.prune_cycles, args.prune_jobs)
                print(f"prune after each of {args.prune_cycles} cycles of "
                      f"{args.prune_jobs} jobs (jobs rows, events rows, jobs kB, "
                      "events kB): " + "; ".join(
                          f"{a} {b} {c // 1024} {d // 1024}" for a, b, c, d in rows))
            await _database(dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        cluster.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--waiting", type=int, default=100_000)
    p.add_argument("--samples", type=int, default=100)
    p.add_argument("--port", type=int, default=55437)
    p.add_argument("--counts-ab", action="store_true")
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fleet", action="store_true")
    p.add_argument("--parked", type=int, default=500)
    p.add_argument("--beats", type=int, default=1000)
    p.add_argument("--window-s", type=float, default=20.0)
    p.add_argument("--prune-cycles", type=int, default=5)
    p.add_argument("--prune-jobs", type=int, default=2000)
    args = p.parse_args()
    asyncio.run(fleet(args) if args.fleet else counts_ab(args) if args.counts_ab
                else run(args))


if __name__ == "__main__":
    main()
