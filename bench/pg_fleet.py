"""The fleet parts of `python -m bench.pg_scale` (issue 28), through a real coordd on a
throwaway PostgreSQL cluster:

- `parked`: N workers, one connection each, heartbeat once, park a claim with nothing to
  take (a job of a role none of them takes waits), and send one more heartbeat so coordd
  knows their roles (coordd.service.push); then the CPU that coordd and every postgres
  process spend over a window, as a % of one core (target: <= 2% for 500);
- `heartbeats`: N workers heartbeating every `every_s` (spread evenly over the period, one
  connection each) for a window, each with a parked claim meanwhile or not: beats sent,
  answered, refused, and their p50/p99 (target: all 1,000 at 5 s get through, 200/s);
- `prune`: cycles of enqueue -> claim -> complete -> prune on one PostgresStore: rows and
  table sizes after each cycle stay flat (bounded), not growing with the cycles.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from coordd import errors
from coordd.client import Client

COOL = {"memory_used_pct": 40.0, "temperature_c": 50.0, "on_battery": False,
        "user_idle_s": 3600.0}


def postgres_procs(cluster: Any) -> list[psutil.Process]:
    """The cluster's postmaster and every backend and helper under it."""
    pid = int((Path(cluster.root) / "data" / "postmaster.pid").read_text().split()[0])
    top = psutil.Process(pid)
    return [top, *top.children(recursive=True)]


def cpu_of(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass  # a backend that ended: its time is lost to both readings alike
    return total


async def _connect(sock: str, n: int) -> list[Client]:
    clients = []
    for _ in range(n):
        c = Client(sock, timeout=600)
        await c.connect()
        clients.append(c)
    return clients


async def parked(cluster: Any, dsn: str, workers: int, window_s: float) -> dict[str, float]:
    """CPU % of one core spent by coordd and postgres while `workers` claims are parked."""
    from bench.daemon import Daemon
    d = Daemon(Path(tempfile.mkdtemp(prefix="bench-pg-parked-")) / "d", probe=False,
               store=dsn)
    d.workdir.mkdir(parents=True)
    d.start()
    clients: list[Client] = []
    claims: list[asyncio.Future[Any]] = []
    try:
        clients = await _connect(d.socket, workers + 1)
        admin = clients.pop()
        await admin.enqueue(kind="k", required_role="nobody", priority=2, payload={})
        for i, c in enumerate(clients):
            await c.heartbeat(f"w{i}", ["cpu"], COOL)
            claims.append(asyncio.ensure_future(
                c.claim(f"w{i}", 30, f"p{i}", wait_s=window_s + 60)))
        await asyncio.sleep(1.0)
        for i, c in enumerate(clients):  # their roles, known from the next heartbeat
            await c.heartbeat(f"w{i}", ["cpu"], COOL)
        await asyncio.sleep(2.0)
        pg = postgres_procs(cluster)
        c0, p0, t0 = d.cpu_total(), cpu_of(pg), time.monotonic()
        await asyncio.sleep(window_s)
        c1, p1, t1 = d.cpu_total(), cpu_of(pg), time.monotonic()
        answered = sum(f.done() for f in claims)
    finally:
        for f in claims:
            f.cancel()
        await asyncio.gather(*claims, return_exceptions=True)
        for c in clients:
            await c.close()
        d.stop()
    span = t1 - t0
    return {"coordd_pct": 100 * (c1 - c0) / span, "postgres_pct": 100 * (p1 - p0) / span,
            "answered_early": answered}


async def heartbeats(dsn: str, workers: int, every_s: float, window_s: float,
                     park: bool = False) -> dict[str, float]:
    """`workers` heartbeating every `every_s` for `window_s` through one coordd; `park`:
    each also holds a parked claim meanwhile (an idle fleet as it runs)."""
    from bench.daemon import Daemon
    d = Daemon(Path(tempfile.mkdtemp(prefix="bench-pg-beats-")) / "d", probe=False,
               store=dsn)
    d.workdir.mkdir(parents=True)
    d.start()
    took: list[float] = []
    refused: dict[str, int] = {}
    sent = 0
    claims: list[asyncio.Future[Any]] = []
    try:
        clients = await _connect(d.socket, workers)
        if park:
            for i, c in enumerate(clients):
                await c.heartbeat(f"w{i}", ["cpu"], COOL)
                claims.append(asyncio.ensure_future(
                    c.claim(f"w{i}", 30, f"p{i}", wait_s=window_s + 60)))
        start = time.monotonic() + 1.0

        async def worker(i: int, c: Client) -> None:
            nonlocal sent
            k = 0
            while True:
                at = start + (i / workers + k) * every_s
                if at >= start + window_s:
                    return
                await asyncio.sleep(max(0.0, at - time.monotonic()))
                sent += 1
                t = time.perf_counter()
                try:
                    await c.heartbeat(f"w{i}", ["cpu"], COOL)
                    took.append(time.perf_counter() - t)
                except errors.CoordError as exc:
                    refused[exc.code] = refused.get(exc.code, 0) + 1
                k += 1
        t0 = time.monotonic()
        await asyncio.gather(*(worker(i, c) for i, c in enumerate(clients)))
        span = time.monotonic() - t0 - 1.0
        for f in claims:
            f.cancel()
        await asyncio.gather(*claims, return_exceptions=True)
        for c in clients:
            await c.close()
    finally:
        d.stop()
    took.sort()
    return {"sent": sent, "answered": len(took), "refused": sum(refused.values()),
            "per_s": len(took) / span, "target_per_s": workers / every_s,
            "p50_ms": 1000 * statistics.median(took) if took else float("nan"),
            "p99_ms": 1000 * took[int(0.99 * (len(took) - 1))] if took else float("nan"),
            **{f"refused_{k}": v for k, v in refused.items()}}


async def prune(dsn: str, cycles: int, jobs: int) -> list[tuple[int, int, int, int]]:
    """(jobs rows, job_events rows, jobs bytes, job_events bytes) after each cycle."""
    from coordd import config as config_mod
    from coordd.ids import JobIds
    from coordd.rules.claim_policy import ClaimPolicy
    from coordd.store import NewJob
    from coordd.store.api import LeaseRef
    from coordd.store.postgres import PostgresStore
    cfg = config_mod.load(None)
    policy = ClaimPolicy(policies=cfg.policies(), heartbeat_stale_s=3600.0,
                         aging_interval_s=0.0)
    st = PostgresStore(dsn)
    await st.start()
    ids = JobIds()
    out = []
    try:
        await st.heartbeat("w", ["cpu"], COOL)
        for _ in range(cycles):
            await st.enqueue([NewJob(job_id=ids.new(time.time()), kind="k",
                                     required_role="cpu", priority=2, payload_json="{}",
                                     run_at=None, max_attempts=3, idempotency_key=None,
                                     max_runtime_s=None, gates_json=None)
                              for _ in range(jobs)])
            while (got := await st.claim("w", 30.0, policy)).job is not None:
                await st.complete(LeaseRef(got.job.job_id, "w", got.lease.token), None)
            while (await st.prune_jobs(time.time() + 1.0))[0]:
                pass
            async with st._conn() as conn:
                out.append(tuple(await conn.fetchrow(
                    "SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM job_events), "
                    "pg_total_relation_size('jobs'), pg_total_relation_size('job_events')")))
    finally:
        await st.close()
    return out
