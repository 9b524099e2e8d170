"""Claim latency behind other roles' waiting jobs on PostgreSQL (issue 28).

    python -m bench.claim_roles [--waiting 100000] [--samples 200] [--roles cpu]
                                [--other gpu] [--heartbeat-each]

On a throwaway cluster, a PostgresStore (the store interface, no daemon): `--samples`
claims of a worker of `--roles` on a queue of one job of its first role (enqueued, then
claimed, one at a time), then the same after `--waiting` jobs of role `--other` are
inserted ahead of them (queued earlier, the table ANALYZEd). `--heartbeat-each`: a
heartbeat before each claim (its gate decision is made again: the one-claim path);
without it the decision is remembered (the batched statement). Prints both p50s and
their ratio (issue 28's target: behind <= 1.5x empty). `--other` equal to a role of
the worker measures a deep queue of its own role.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from coordd import config as config_mod
from coordd.ids import JobIds
from coordd.store.sqlite.leases import ClaimPolicy
from coordd.store.api import NewJob

COOL = {"memory_used_pct": 40.0, "temperature_c": 50.0, "on_battery": False,
        "user_idle_s": 3600.0}
SQL_FILL = (  # $1 how many, $2 role: waiting jobs queued before any other
    "INSERT INTO jobs (job_id, kind, required_role, priority, payload_json, status, "
    "max_attempts, run_at, queued_at, created_at, updated_at) SELECT 'z' || "
    "lpad(g::text, 12, '0'), 'k', $2, 2, '{}', 'waiting', 3, 0, 1, 1, 1 "
    "FROM generate_series(1, $1) g"
)


async def _claims(st, policy, ids, roles, n, heartbeat_each) -> float:
    took = []
    for i in range(n):
        await st.enqueue([NewJob(job_id=ids.new(time.time()), kind="k", required_role=roles[0],
                                 priority=2, payload_json="{}", run_at=None, max_attempts=3,
                                 idempotency_key=None, max_runtime_s=None, gates_json=None)])
        if heartbeat_each or i == 0:
            await st.heartbeat("w", roles, COOL)
        t = time.perf_counter()
        got = await st.claim("w", 30.0, policy)
        took.append(time.perf_counter() - t)
        assert got.job is not None, got
    return statistics.median(took) * 1000


async def run(args: argparse.Namespace) -> None:
    from coordd.store.postgres import PostgresStore
    from coordd.store.postgres.throwaway import Cluster
    cfg = config_mod.load(None)
    policy = ClaimPolicy(policies=cfg.policies(), heartbeat_stale_s=cfg.heartbeat_stale_s,
                         aging_interval_s=0.0)
    roles = args.roles.split(",")
    cluster = Cluster(port=args.port)
    dsn = cluster.start()
    try:
        st = PostgresStore(dsn)
        await st.start()
        ids = JobIds()
        empty = await _claims(st, policy, ids, roles, args.samples, args.heartbeat_each)
        async with st._conn() as conn:
            await conn.execute(SQL_FILL, args.waiting, args.other)
            await conn.execute("ANALYZE jobs")
        behind = await _claims(st, policy, ids, roles, args.samples, args.heartbeat_each)
        await st.close()
    finally:
        cluster.stop()
    print(f"roles {roles}, {args.waiting} waiting of role {args.other} ahead: claim p50 "
          f"empty {empty:.2f} ms, behind {behind:.2f} ms ({behind / empty:.2f}x)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--waiting", type=int, default=100_000)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--roles", default="cpu")
    p.add_argument("--other", default="gpu")
    p.add_argument("--heartbeat-each", action="store_true")
    p.add_argument("--port", type=int, default=55433)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
