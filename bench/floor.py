"""`python -m bench.floor`: the least a claim + complete can cost in coordd's shape, next to
the bare per-op loop that bench.run divides by (issue 30: how far the ratio goals are
from what this design can reach at all).

Three figures, on the same machine in one run:

- `bare`: bench.baselines' per-op loop: one transaction per claim and one per complete
  (what bench.run's `ratio_drain*_vs_bare` divides by), µs per job.
- `one_commit`: the same statements, the complete of job i and the claim of job i+1 in
  one transaction: the SQLite work of coordd's one-client path (eager dispatch: one
  request, one COMMIT a job) without anything of coordd; `grouped`: 16 of those pairs a
  transaction (a 16-client group commit).
- `rpc`: an echo server (uvloop, coordd's frames: a 4-byte length and msgpack) in a
  child process, and sequential calls with a coordd-shaped `complete` request: µs per
  round trip at one client (client and server together); at 16 clients (two load
  processes, as bench.run), the server's CPU per request (its read, decode, encode and
  write; no work).

The floors: one client cannot beat `rpc` + `one_commit` a job (its steps run one after
another); 16 clients on a one-core writer cannot beat the server's `rpc` CPU + `grouped`
a job. Each is printed as the largest ratio to `bare` it allows, beside the goals.

    python -m bench.floor [--jobs 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import msgspec

from bench import baselines
from coordd.net.frames import HEADER

GROUP = 16
RPC_CLIENTS = 16
LOAD_PROCS = 2  # as bench.run: 16 connections from two load processes


def _sql_drain(workdir: Path, n: int, per_txn: int) -> float:
    """µs per job draining N bare jobs with `per_txn` complete+claim pairs a transaction
    (0: bench.baselines' per-op loop, a transaction each)."""
    conn = baselines.connect(str(workdir / f"floor{per_txn}.db"))
    conn.execute("BEGIN IMMEDIATE")
    now = time.time()
    for i in range(n):
        baselines.insert(conn, i, now)
    conn.execute("COMMIT")
    t0 = time.perf_counter()
    done = 0
    if per_txn == 0:
        while (got := baselines.claim(conn, "floor-0")) is not None:
            baselines.complete(conn, "floor-0", *got)
            done += 1
    else:
        conn.execute("BEGIN IMMEDIATE")
        held = [baselines.claim_in(conn, f"floor-{k}", time.time()) for k in range(per_txn)]
        conn.execute("COMMIT")
        while any(held):
            conn.execute("BEGIN IMMEDIATE")
            now = time.time()
            for k, got in enumerate(held):
                if got is not None:
                    baselines.complete_in(conn, f"floor-{k}", *got, now)
                    done += 1
                    held[k] = baselines.claim_in(conn, f"floor-{k}", now)
            conn.execute("COMMIT")
    dt = time.perf_counter() - t0
    conn.close()
    if done != n:
        raise RuntimeError(f"floor drain: {done} of {n}")
    return 1e6 * dt / n


class _Echo(asyncio.Protocol):
    """Decode each frame and send the decoded value back, as a reply (one frame a read:
    the clients send one request at a time)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport

    def data_received(self, data: bytes) -> None:
        req = msgspec.msgpack.decode(data[HEADER.size:])
        body = msgspec.msgpack.encode({"id": req["id"], "result": req["params"]})
        self.t.write(HEADER.pack(len(body)) + body)  # type: ignore[attr-defined]


def _server(path: str, ready, done, out) -> None:  # type: ignore[no-untyped-def]
    import uvloop

    async def main() -> None:
        server = await asyncio.get_running_loop().create_unix_server(_Echo, path)
        ready.set()
        while not done.is_set():
            await asyncio.sleep(0.05)
        server.close()

    cpu0 = _cpu()
    uvloop.run(main())
    out.put(_cpu() - cpu0)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _calls(path: str, n: int) -> None:
    reader, writer = await asyncio.open_unix_connection(path)
    body = msgspec.msgpack.encode({"id": 1, "method": "complete", "params": {
        "job_id": "0" * 26, "worker_id": "gpu-box-1", "token": 3, "result": None,
        "next": {}}})
    frame = HEADER.pack(len(body)) + body
    for _ in range(n):
        writer.write(frame)
        (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
        await reader.readexactly(size)
    writer.close()


def _client_proc(path: str, conns: int, per: int, ready, go, out) -> None:  # type: ignore[no-untyped-def]
    import uvloop

    async def run() -> float:
        await _calls(path, 100)  # warm up
        ready.put(1)
        while not go.is_set():
            await asyncio.sleep(0.001)
        t0 = time.perf_counter()
        await asyncio.gather(*(_calls(path, per) for _ in range(conns)))
        return time.perf_counter() - t0

    out.put(uvloop.run(run()))


def _rpc(workdir: Path, n: int, clients: int, procs: int) -> tuple[float, float]:
    """(µs per round trip at `clients` connections from `procs` load processes, the
    server's CPU µs per request)."""
    ctx = mp.get_context("fork")
    path = str(workdir / f"echo{clients}.sock")
    ready, done, cpu_out = ctx.Event(), ctx.Event(), ctx.Queue()
    server = ctx.Process(target=_server, args=(path, ready, done, cpu_out), daemon=True)
    server.start()
    loads = []
    try:
        if not ready.wait(20):
            raise RuntimeError("echo server did not start")
        per = n // clients
        warm, go, walls = ctx.Queue(), ctx.Event(), ctx.Queue()
        loads = [ctx.Process(target=_client_proc, daemon=True,
                             args=(path, clients // procs, per, warm, go, walls))
                 for _ in range(procs)]
        for lp in loads:
            lp.start()
        for _ in loads:
            warm.get(timeout=20)
        go.set()
        wall = max(walls.get(timeout=600) for _ in loads)
        done.set()
        cpu = cpu_out.get(timeout=20)
    finally:
        done.set()
        for proc in (server, *loads):
            proc.join(20)
    requests = per * (clients // procs) * procs
    return 1e6 * wall / requests, 1e6 * cpu / (requests + 100 * procs)


def measure(n: int) -> dict:
    """One round of every figure (µs per job or per request) and the ratios they allow."""
    with tempfile.TemporaryDirectory(prefix="coordd-floor-") as w:
        work = Path(w)
        bare = _sql_drain(work, n, 0)
        one = _sql_drain(work, n, 1)
        grouped = _sql_drain(work, n, GROUP)
        rpc1, _ = _rpc(work, n, 1, 1)
        _, rpc16_cpu = _rpc(work, n, RPC_CLIENTS, LOAD_PROCS)
    return {"bare_us": bare, "one_commit_us": one, "grouped_us": grouped,
            "rpc1_round_trip_us": rpc1, "rpc16_server_cpu_us": rpc16_cpu,
            "max_ratio_1_client": bare / (rpc1 + one),
            "max_ratio_16_clients": bare / (rpc16_cpu + grouped)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=10_000, help="jobs per figure (default 10000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; medians printed (default 3)")
    args = p.parse_args(argv)
    rounds = []
    for i in range(args.rounds):
        r = measure(args.jobs)
        rounds.append(r)
        print(f"round {i + 1}: " + "  ".join(f"{k} {v:.2f}" for k, v in r.items()), flush=True)
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(f"\nmedians of {args.rounds} rounds, {args.jobs} jobs, pid {os.getpid()}:")
    print(f"  bare per-op loop           {med['bare_us']:7.1f} µs/job  (bench.run's `bare`)")
    print(f"  one commit a job           {med['one_commit_us']:7.1f} µs/job  (the same SQL)")
    print(f"  {GROUP} jobs a commit          {med['grouped_us']:7.1f} µs/job")
    print(f"  RPC round trip, 1 client   {med['rpc1_round_trip_us']:7.1f} µs  (echo, no work)")
    print(f"  RPC server CPU, {RPC_CLIENTS} clients {med['rpc16_server_cpu_us']:7.1f} µs/request")
    print(f"  floor, 1 client:   at most {med['max_ratio_1_client']:.2f}x bare (goal 1x)")
    print(f"  floor, 16 clients: at most {med['max_ratio_16_clients']:.2f}x bare (goal 3x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
