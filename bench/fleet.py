"""Fleet scale (issue 18): N simulated workers over mutual TLS against the same N over the
Unix socket, in one run.

    python -m bench.fleet [--workers 100,500,1000] [--jobs 2000] [--out FILE.json]
                          [--idle-s 60] [--stale] [--store sqlite|postgresql]

Per transport and N, on a fresh coordd (bench/daemon.py, the writer probe off): N workers
connect (one connection each, in this process; a certificate per worker id, made by
coordd.net.pki), heartbeat every 5 s and keep one claim parked (`wait_s` 30); then `--jobs`
short jobs are enqueued in one batch and the workers drain them (claim, complete at once,
claim again). Printed: connect cost per connection (TCP + TLS handshake, or a Unix
connect; one at a time), coordd's RSS per connection (RSS after the connects minus before,
/ N), the drain's jobs/s and coordd CPU seconds per 1,000 jobs, and the claim round trip
p50/p99 of claims that found a job at once (reply time minus `waited_s`). The TLS/Unix
ratios of the same N are the figures to read: the machine is shared and noisy.

Idle (issue 30, `--idle-s S`, TLS only): the N workers heartbeat every 5 s (phases spread
over the interval) with one claim parked each and no job, for S seconds; printed: coordd's
CPU as % of one core and CPU µs per heartbeat. With `--stale`, one worker then stops
beating and `workers` is polled every 0.1 s: the seconds from its last beat's reply until
coordd shows it not live (expected: heartbeat_stale_s, 30 s by default, plus the poll).
With `--store postgresql` the idle measurement runs coordd on a throwaway PostgreSQL cluster
and adds the CPU of every postgres process (% of a core, µs per heartbeat).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import uvloop

from bench import pg_fleet
from bench.daemon import Daemon, pct
from coordd.net import pki
from coordd.client import Client
from coordd.transport import Connector, TlsFiles

READINGS = {"memory_used_pct": 10.0, "temperature_c": 40.0, "on_battery": False,
            "user_idle_s": 99999.0}
HEARTBEAT_S = 5.0
PARK_S = 30.0


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _phase(transport: str, n: int, jobs: int, certs: Path, port: int,
                 workdir: Path) -> dict:
    cfg = ""
    if transport == "tls":
        cfg = (f'listen_tcp = "127.0.0.1:{port}"\ntls_cert = "{certs}/server-coordd.pem"\n'
               f'tls_key = "{certs}/server-coordd.key"\ntls_client_ca = "{certs}/ca.pem"\n'
               "park_max_per_connection = 4\n")
    d = Daemon(workdir, probe=False, config=cfg).start()
    try:
        async with Client(d.socket) as probe:
            await probe.status()  # the database is open: the TCP listener serves too
        rss0 = d.rss_mb()[0]
        clients: list[Client] = []
        connect_s: list[float] = []
        for i in range(n):
            wid = f"w{i}"
            if transport == "tls":
                conn = Connector(f"tls://127.0.0.1:{port}", TlsFiles(
                    str(certs / f"worker-{wid}.pem"), str(certs / f"worker-{wid}.key"),
                    str(certs / "ca.pem")), connect_timeout_s=30)
                c = Client(connector=conn, timeout=60)
            else:
                c = Client(d.socket, timeout=60)
            t0 = time.perf_counter()
            await c.connect()
            connect_s.append(time.perf_counter() - t0)
            await c.heartbeat(wid, ["cpu"], READINGS)
            clients.append(c)
        rss1 = d.rss_mb()[0]
        done = asyncio.Event()
        left = [jobs]
        rtts: list[float] = []

        async def beat(c: Client, wid: str) -> None:
            while not done.is_set():
                try:
                    await asyncio.wait_for(done.wait(), HEARTBEAT_S)
                except asyncio.TimeoutError:
                    await c.heartbeat(wid, ["cpu"], READINGS)

        async def work(c: Client, wid: str) -> None:
            while not done.is_set():
                t0 = time.perf_counter()
                r = await c.claim(wid, lease_s=60, claim_id=uuid.uuid4().hex, wait_s=PARK_S)
                if r.job is None:
                    continue
                rtts.append(time.perf_counter() - t0 - r.waited_s)
                await c.complete(r.job.job_id, wid, r.lease.token, {"ok": 1})
                left[0] -= 1
                if left[0] <= 0:
                    done.set()

        tasks = [asyncio.create_task(f(c, f"w{i}")) for i, c in enumerate(clients)
                 for f in (beat, work)]
        await asyncio.sleep(0.5)  # every claim parked
        async with Client(d.socket, timeout=120) as admin:
            d.mark_cpu()
            t0 = time.perf_counter()
            for start in range(0, jobs, 1000):
                await admin.enqueue_batch([{"kind": "k", "required_role": "cpu", "priority": 1,
                                            "payload": {}} for _ in range(min(1000, jobs - start))])
            await asyncio.wait_for(done.wait(), 600)
            wall = time.perf_counter() - t0
            cpu = d.cpu_since_mark()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    finally:
        d.stop()
    rtts.sort()
    return {"transport": transport, "workers": n, "jobs": jobs,
            "connect_ms_mean": 1000 * statistics.mean(connect_s),
            "connect_ms_p99": 1000 * pct(connect_s, 99),
            "rss_kb_per_conn": (rss1 - rss0) * 1024 / n,
            "drain_jobs_s": jobs / wall, "cpu_s_per_1k_jobs": cpu * 1000 / jobs,
            "claim_p50_ms": 1000 * pct(rtts, 50), "claim_p99_ms": 1000 * pct(rtts, 99)}


async def _idle(n: int, idle_s: float, stale: bool, certs: Path, port: int,
                workdir: Path, cluster: Any = None, dsn: str = "") -> dict:
    """N TLS workers idle (heartbeats + a parked claim each): coordd CPU, and the stale
    detection time of one that stops beating. With `cluster` and `dsn` (a throwaway
    PostgreSQL cluster and a fresh database on it) coordd runs on that store, and the
    CPU of every postgres process is counted beside coordd's."""
    cfg = (f'listen_tcp = "127.0.0.1:{port}"\ntls_cert = "{certs}/server-coordd.pem"\n'
           f'tls_key = "{certs}/server-coordd.key"\ntls_client_ca = "{certs}/ca.pem"\n'
           "park_max_per_connection = 4\n")
    d = Daemon(workdir, probe=False, config=cfg, base="",  # coordd's stale_s, 30 s
               store=dsn).start()
    rng = random.Random(7)
    beats = [0]
    last: dict[str, float] = {}
    try:
        async with Client(d.socket) as probe:
            await probe.status()  # the database is open: the TCP listener serves too
        clients: list[Client] = []
        for i in range(n):
            wid = f"w{i}"
            c = Client(connector=Connector(f"tls://127.0.0.1:{port}", TlsFiles(
                str(certs / f"worker-{wid}.pem"), str(certs / f"worker-{wid}.key"),
                str(certs / "ca.pem")), connect_timeout_s=30), timeout=60)
            await c.connect()
            await c.heartbeat(wid, ["cpu"], READINGS)
            clients.append(c)

        async def beat(c: Client, wid: str) -> None:
            await asyncio.sleep(rng.uniform(0, HEARTBEAT_S))
            while True:
                await c.heartbeat(wid, ["cpu"], READINGS)
                last[wid] = time.monotonic()
                beats[0] += 1
                await asyncio.sleep(HEARTBEAT_S)

        async def park(c: Client, wid: str) -> None:
            while True:
                await c.claim(wid, lease_s=60, wait_s=PARK_S)

        beating = [asyncio.create_task(beat(c, f"w{i}")) for i, c in enumerate(clients)]
        parked = [asyncio.create_task(park(c, f"w{i}")) for i, c in enumerate(clients)]
        await asyncio.sleep(HEARTBEAT_S + 1)  # every worker beat once, in its phase
        pg = pg_fleet.postgres_procs(cluster) if cluster is not None else []
        d.mark_cpu()
        b0, t0, p0 = beats[0], time.perf_counter(), pg_fleet.cpu_of(pg)
        await asyncio.sleep(idle_s)
        cpu, wall, nbeats = d.cpu_since_mark(), time.perf_counter() - t0, beats[0] - b0
        row = {"transport": "tls", "store": "postgresql" if dsn else "sqlite", "workers": n,
               "idle_s": round(wall, 1), "beats": nbeats,
               "idle_cpu_pct": 100 * cpu / wall, "us_per_beat": 1e6 * cpu / max(1, nbeats)}
        if pg:
            pg_cpu = pg_fleet.cpu_of(pg) - p0
            row.update(postgres_cpu_pct=100 * pg_cpu / wall,
                       postgres_us_per_beat=1e6 * pg_cpu / max(1, nbeats))
        if stale:
            beating[0].cancel()
            await asyncio.gather(beating[0], return_exceptions=True)
            gone = last["w0"]
            async with Client(d.socket, timeout=60) as admin:
                while True:
                    views = {w.worker_id: w for w in (await admin.workers()).workers}
                    if os.environ.get("FLEET_DEBUG"):
                        print(views["w0"].heartbeat_age_s, views["w0"].live, flush=True)
                    if not views["w0"].live:
                        row["stale_detect_s"] = time.monotonic() - gone
                        break
                    await asyncio.sleep(0.1)
        for t in (*beating, *parked):
            t.cancel()
        await asyncio.gather(*beating, *parked, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    finally:
        d.stop()
    return row


async def _idle_on(store: str, n: int, idle_s: float, stale: bool, certs: Path,
                   workdir: Path) -> dict:
    """`_idle` on `store` ("sqlite", or "postgresql": a throwaway cluster of its own)."""
    if store == "sqlite":
        return await _idle(n, idle_s, stale, certs, _free_port(), workdir)
    from bench.drain_stores import fresh_database
    from coordd.store.postgres.throwaway import Cluster
    cluster = Cluster(port=_free_port())
    try:
        _, db = await asyncio.to_thread(fresh_database, cluster.start())
        return await _idle(n, idle_s, stale, certs, _free_port(), workdir, cluster, db)
    finally:
        cluster.stop()


async def _main(args: argparse.Namespace) -> list[dict]:
    sizes = [int(x) for x in args.workers.split(",")]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    out = []
    with tempfile.TemporaryDirectory(prefix="coordd-fleet-") as tmp:
        certs = Path(tmp) / "ca"
        pki.init_ca(certs)
        pki.issue(certs, server="coordd")
        for i in range(max(sizes)):
            pki.issue(certs, worker=f"w{i}")
        for n in sizes:
            if args.idle_s:
                work = Path(tmp) / f"idle-{n}"
                work.mkdir()
                row = await _idle_on(args.store, n, args.idle_s, args.stale, certs, work)
                out.append(row)
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                  for k, v in row.items()}), flush=True)
            if args.no_drain:
                continue
            for transport in ("unix", "tls"):
                work = Path(tmp) / f"{transport}-{n}"
                work.mkdir()
                row = await _phase(transport, n, args.jobs, certs, _free_port(), work)
                out.append(row)
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                  for k, v in row.items()}), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n")[0])
    p.add_argument("--workers", default="100,500,1000")
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--out", help="write the rows as JSON here")
    p.add_argument("--idle-s", type=float, default=0.0,
                   help="also measure N idle TLS workers for this long (0: skip)")
    p.add_argument("--stale", action="store_true",
                   help="with --idle-s: time until a worker that stops beating is stale")
    p.add_argument("--no-drain", action="store_true", help="only the idle measurement")
    p.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite",
                   help="the store of the idle measurement (postgresql: a throwaway cluster "
                        "of PostgreSQL's server binaries; its CPU is counted too)")
    args = p.parse_args()
    rows = uvloop.run(_main(args))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    for r in rows:
        if "idle_cpu_pct" in r:
            pg = (f" + postgres {r['postgres_cpu_pct']:.2f}% / "
                  f"{r['postgres_us_per_beat']:.0f} µs" if "postgres_cpu_pct" in r else "")
            print(f"idle TLS N={r['workers']} ({r['store']}): coordd {r['idle_cpu_pct']:.2f}% "
                  f"of a core, {r['us_per_beat']:.0f} µs CPU per heartbeat{pg} ({r['beats']} "
                  f"beats in {r['idle_s']} s)"
                  + (f", stale seen after {r['stale_detect_s']:.1f} s"
                     if "stale_detect_s" in r else ""))
    rows = [r for r in rows if "idle_cpu_pct" not in r]
    if not rows:
        return
    by = {(r["transport"], r["workers"]): r for r in rows}
    print(f"\n{'N':>5} {'connect ms tls/unix':>22} {'RSS KiB/conn tls/unix':>24} "
          f"{'jobs/s tls/unix':>18} {'CPU s/1k tls/unix':>19} {'claim p99 ms tls/unix':>23}")
    for n in sorted({r["workers"] for r in rows}):
        t, u = by[("tls", n)], by[("unix", n)]
        print(f"{n:>5} {t['connect_ms_mean']:>9.2f} / {u['connect_ms_mean']:<9.2f} "
              f"{t['rss_kb_per_conn']:>10.1f} / {u['rss_kb_per_conn']:<10.1f} "
              f"{t['drain_jobs_s']:>7.0f} / {u['drain_jobs_s']:<7.0f} "
              f"{t['cpu_s_per_1k_jobs']:>7.3f} / {u['cpu_s_per_1k_jobs']:<7.3f} "
              f"{t['claim_p99_ms']:>9.2f} / {u['claim_p99_ms']:<9.2f}")


if __name__ == "__main__":
    main()
