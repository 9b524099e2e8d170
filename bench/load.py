"""Client load in separate processes: enqueue (one per request or batched) and drain.

Each load process runs its own uvloop and K `coordd.client.Client` connections. The
parent starts the processes, waits until every connection is open (and, for a drain,
has sent its heartbeat), then opens a shared gate so all connections start together.
Wall time runs from the gate to the last connection finishing (perf_counter is
CLOCK_MONOTONIC, comparable across processes on Linux). Each process reports its own
CPU seconds, so the client's share of the 2 cores is visible.

A drain claims its next job in the `complete` that ends the last one (eager dispatch,
coordd.wire.claims) when both the client library and the daemon under test have it (an
older tree, `--rev 9727d64`, or COORDD_BENCH_EAGER=0: a plain `claim` per job); `rpcs`
counts the calls either way.
"""

from __future__ import annotations

import array
import asyncio
import inspect
import multiprocessing as mp
import os
import resource
import time
from dataclasses import dataclass

import uvloop

from coordd.client import Client

JOB = {"kind": "bench", "required_role": "cpu", "priority": 1}
ROLES = ["cpu"]
READINGS = {"memory_used_pct": 10.0, "temperature_c": 40.0, "on_battery": False,
            "user_idle_s": 3600.0}
CALL_TIMEOUT_S = 300.0
EAGER = os.environ.get("COORDD_BENCH_EAGER", "1") != "0"  # 0: a claim per job, always
READY_TIMEOUT_S = 120.0


@dataclass
class PhaseResult:
    """What one load phase measured (all processes together)."""

    wall_s: float
    done: int
    client_cpu_s: float
    claim_lat: array.array
    complete_lat: array.array
    rpcs: int = 0  # drain: claim and complete calls made

    @property
    def rate(self) -> float:
        return self.done / self.wall_s if self.wall_s > 0 else 0.0


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _enqueue_one(c: Client, ids: range) -> tuple[int, list, list]:
    for i in ids:
        await c.enqueue(**JOB, payload={"i": i})
    return len(ids), [], []


async def _enqueue_batches(c: Client, ids: range, batch: int) -> tuple[int, list, list]:
    n = 0
    for lo in range(ids.start, ids.stop, batch):
        jobs = [{**JOB, "payload": {"i": i}} for i in range(lo, min(lo + batch, ids.stop))]
        n += len((await c.enqueue_batch(jobs)).jobs)
    return n, [], []


def _next_ask() -> object | None:
    """A `next` for complete when this client library has eager dispatch, else None."""
    try:
        from coordd.wire.claims import ClaimAsk
    except ImportError:  # an older tree (--rev)
        return None
    return ClaimAsk() if "next" in inspect.signature(Client.complete).parameters else None


async def _drain(c: Client, worker_id: str, limit: int,
                 eager: bool = True) -> tuple[int, list, list, int]:
    """Claim and complete until nothing is left (or `limit` jobs): with eager dispatch
    (see the module doc) the complete brings the next job; a claim's latency is that of
    the call that brought its job. Returns (jobs, claim latencies, complete latencies,
    calls made)."""
    claims: list[float] = []
    completes: list[float] = []
    pc = time.perf_counter
    ask = _next_ask() if eager else None
    rpcs = 0
    r = None
    while limit <= 0 or len(claims) < limit:
        if r is None:
            t0 = pc()
            r = await c.claim(worker_id)
            rpcs += 1
            t1 = pc()
            if r.job is None:
                break
            claims.append(t1 - t0)
        t1 = pc()
        more = ask is not None and (limit <= 0 or len(claims) < limit)
        if more:
            done = await c.complete(r.job.job_id, worker_id, r.lease.token, None, next=ask)
        else:
            done = await c.complete(r.job.job_id, worker_id, r.lease.token, None)
        rpcs += 1
        t2 = pc()
        completes.append(t2 - t1)
        nxt = done.next if more else None
        if more and nxt is None:
            ask = None  # the daemon under test does not claim on complete: plain claims
        if nxt is not None and nxt.job is not None:
            claims.append(t2 - t1)
            r = nxt
        elif nxt is not None:  # nothing due (the queue is drained)
            break
        else:
            r = None
    return len(claims), claims, completes, rpcs


async def _proc_main(kind: str, sock: str, specs: list, batch: int, ready, go, out) -> None:
    """One load process; `batch` is the batch size for enqueue_batch, the per-connection
    claim limit for drain (0 = until coordd has nothing left)."""
    clients = [Client(sock, timeout=CALL_TIMEOUT_S) for _ in specs]
    for c, spec in zip(clients, specs):
        await c.connect()
        if kind == "drain":
            await c.heartbeat(spec, ROLES, READINGS)
    ready.put(1)
    await asyncio.get_running_loop().run_in_executor(None, go.wait)
    cpu0 = _cpu()
    if kind == "drain":
        coros = [_drain(c, w, batch, EAGER) for c, w in zip(clients, specs)]
    elif kind == "enqueue":
        coros = [_enqueue_one(c, ids) for c, ids in zip(clients, specs)]
    else:
        coros = [_enqueue_batches(c, ids, batch) for c, ids in zip(clients, specs)]
    results = [(*r, 0)[:4] for r in await asyncio.gather(*coros)]
    t_end = time.perf_counter()
    cpu = _cpu() - cpu0
    for c in clients:
        await c.close()
    claims, completes = array.array("d"), array.array("d")
    for _, cl, co, _ in results:
        claims.extend(cl)
        completes.extend(co)
    out.put((sum(r[0] for r in results), t_end, cpu, claims.tobytes(), completes.tobytes(),
             sum(r[3] for r in results)))


def _proc_entry(*args) -> None:  # type: ignore[no-untyped-def]
    uvloop.run(_proc_main(*args))


def run_phase(kind: str, sock: str, n_conns: int, n_procs: int, n_jobs: int = 0,
              batch: int = 500, tag: str = "w", on_go=None, limit: int = 0) -> PhaseResult:
    """Run one phase: kind is "enqueue", "enqueue_batch" or "drain".

    Connections are dealt round-robin to `n_procs` processes; enqueue work is split into
    contiguous id ranges, one per connection. `on_go()` runs just before the gate opens
    (the caller marks daemon CPU and writer stats there).
    """
    ctx = mp.get_context("fork")
    n_procs = max(1, min(n_procs, n_conns))
    if kind == "drain":
        specs = [f"{tag}-{i}" for i in range(n_conns)]
    else:
        step = -(-n_jobs // n_conns)
        specs = [range(i * step, min(n_jobs, (i + 1) * step)) for i in range(n_conns)]
    per_proc = [specs[p::n_procs] for p in range(n_procs)]
    if kind == "drain":
        batch = limit
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_proc_entry, args=(kind, sock, s, batch, ready, go, out),
                         daemon=True) for s in per_proc]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=READY_TIMEOUT_S)
        if on_go is not None:
            on_go()
        t_go = time.perf_counter()
        go.set()
        got = [out.get(timeout=CALL_TIMEOUT_S * 4) for _ in procs]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    claims, completes = array.array("d"), array.array("d")
    for g in got:
        claims.frombytes(g[3])
        completes.frombytes(g[4])
    return PhaseResult(wall_s=max(g[1] for g in got) - t_go, done=sum(g[0] for g in got),
                       client_cpu_s=sum(g[2] for g in got), claim_lat=claims,
                       complete_lat=completes, rpcs=sum(g[5] for g in got))
