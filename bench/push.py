"""Push latency (issue 15): what parked calls buy, as ratios within one run.

    python -m bench.push [--rounds 3] [--samples 200] [--parked 1000] [--idle-s 10]
                         [--out FILE.json]

One round, each part on a fresh coordd (bench/daemon.py, the writer probe off):

1. **enqueue -> claim** with idle workers parked: 4 workers (one connection each, in this
   process) loop `claim(wait_s=30)` and complete what they get; a producer on its own
   connection enqueues one P1 job at a time, waits for its claim reply and pauses 5 ms
   (the workers park again). Latency = the enqueue call's start to the claim reply's
   arrival at the worker (perf_counter, one process).
2. **enqueue -> wait_job return** against **bare spawn**: one real `coord-worker` (one slot,
   the default claim_wait_s = 30, parked) runs bench/supervisor.py's model (exits at once);
   the producer enqueues and calls `wait_job` at once, one job at a time. Bare spawn = the
   same argv spawned and waited for, one at a time (Popen to exit). Target: p50 <= bare p50
   + 10 ms.
3. **cancel -> SIGTERM at the model**: the same worker runs a model that writes a ready
   file and waits; the producer sends `cancel` (what `coordctl cancel` sends; coordctl's
   own interpreter start-up is left out) and the model's SIGTERM handler writes
   `time.time()`. Latency = cancel call start to that time (one machine's wall clock).
4. **coordd CPU with N parked claims** and nothing to do: N workers heartbeat once, then
   N claims park (`wait_s` 300) over N/10 connections; coordd's CPU seconds (psutil) over
   `--idle-s` seconds, as % of one core.
5. **enqueue -> claim of a P0 arriving just after the previous job ended**, on a real
   `coord-worker` of each shape: one kind (`noop`, one slot) and several kinds (`noop`
   and `sleeper`, one slot each, as examples/worker.toml runs several), both with
   claim_interval_s = 1. The producer enqueues a P0 `noop`, `wait_job`s it, and enqueues
   the next at once. Latency = the job's claim event minus its enqueue (coordd's clock).
   While `noop` runs, the several-kinds worker's parked claim names only `sleeper`; the
   freed slot must reach coordd at once (issue 31): target p50 <= 20 ms on both shapes.

Medians over rounds of each round's p50/p99. Drain figures are `python -m bench.run`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from bench.daemon import Daemon, pct
from bench.supervisor import READINGS, REPO, model_argv
from coordd.client import Client

WORKERS = 4
GAP_S = 0.005
PARK_WAIT_S = 300.0
CLAIMS_PER_CONNECTION = 10
TARGETS = {"claim_p50_ms": 1.0, "claim_p99_ms": 5.0, "result_over_spawn_p50_ms": 10.0,
           "cancel_p99_ms": 50.0, "idle_cpu_pct": 1.0, "after_end_one_kind_p50_ms": 20.0,
           "after_end_kinds_p50_ms": 20.0}
SLEEPER_CODE = (
    "import json,os,signal,sys,time\n"
    "p=json.load(open(os.environ['COORD_PAYLOAD']));d=p['dir'];j=os.environ['COORD_JOB_ID']\n"
    "def term(*a):\n"
    " t=time.time();f=os.path.join(d,j);open(f+'.tmp','w').write(repr(t))\n"
    " os.replace(f+'.tmp',f+'.term');os._exit(0)\n"
    "signal.signal(signal.SIGTERM,term)\n"
    "open(os.path.join(d,j+'.ready'),'w').write('1')\n"
    "while True: time.sleep(1)\n")


# ---------------------------------------------------------------- 1. enqueue -> claim


async def claim_latency(sock: str, samples: int) -> dict:
    arrived: dict[str, float] = {}
    got = asyncio.Event()
    stop = asyncio.Event()

    async def work(i: int) -> None:
        async with Client(sock, timeout=60) as c:
            await c.heartbeat(f"bw{i}", ["cpu"], READINGS)
            while not stop.is_set():
                res = await c.claim(f"bw{i}", lease_s=60, wait_s=30)
                if res.job is not None:
                    arrived[res.job.job_id] = time.perf_counter()
                    got.set()
                    await c.complete(res.job.job_id, f"bw{i}", res.lease.token, {})

    tasks = [asyncio.create_task(work(i)) for i in range(WORKERS)]
    lat = []
    async with Client(sock, timeout=60) as p:
        await asyncio.sleep(0.3)
        for k in range(samples):
            got.clear()
            t0 = time.perf_counter()
            job = (await p.enqueue(kind="k", required_role="cpu", priority=1,
                                   payload={"k": k})).job_id
            while job not in arrived:
                await asyncio.wait_for(got.wait(), 10)
                got.clear()
            lat.append(arrived[job] - t0)
            await asyncio.sleep(GAP_S)
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"claim_p50_ms": 1e3 * pct(lat, 50), "claim_p99_ms": 1e3 * pct(lat, 99)}


# ---------------------------------------------------------------- 2, 3. with a coord-worker


def _worker_toml(work_dir: Path, sleeper: bool = True) -> str:
    lines = ["lease_s = 60", "heartbeat_interval_s = 5", "grace_s = 2", "stop_timeout_s = 10",
             "claim_interval_s = 1", f"work_dir = {json.dumps(str(work_dir))}",
             "[kinds.noop]", f"argv = {json.dumps(model_argv())}", "slots = 1", "timeout_s = 60"]
    if sleeper:
        lines += ["[kinds.sleeper]",
                  f"argv = {json.dumps([sys.executable, '-S', '-c', SLEEPER_CODE])}",
                  "slots = 1", "timeout_s = 600"]
    return "\n".join(lines) + "\n"


async def _wait_file(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear")
        await asyncio.sleep(0.002)


async def worker_latencies(sock: str, samples: int, cancels: int, tmp: Path) -> dict:
    result, cancel = [], []
    async with Client(sock, timeout=60) as p:
        for k in range(samples + 3):  # the first three warm the worker's paths up
            t0 = time.perf_counter()
            job = (await p.enqueue(kind="noop", required_role="cpu", priority=0,
                                   payload={"k": k})).job_id
            done = await p.wait_job(job, 30)
            if not done.terminal or done.job.status != "succeeded":
                raise RuntimeError(f"noop job {job}: {done.job.status} {done.job.last_error}")
            if k >= 3:
                result.append(time.perf_counter() - t0)
        for k in range(cancels):
            job = (await p.enqueue(kind="sleeper", required_role="cpu", priority=0,
                                   payload={"dir": str(tmp)})).job_id
            await _wait_file(tmp / f"{job}.ready")
            await asyncio.sleep(0.05)  # the worker's control watch is parked again
            t0 = time.time()
            await p.cancel(job)
            await _wait_file(tmp / f"{job}.term")
            cancel.append(float((tmp / f"{job}.term").read_text()) - t0)
            await p.wait_job(job, 30)
    return {"result_p50_ms": 1e3 * pct(result, 50), "result_p99_ms": 1e3 * pct(result, 99),
            "cancel_p50_ms": 1e3 * pct(cancel, 50), "cancel_p99_ms": 1e3 * pct(cancel, 99)}


async def after_end(sock: str, samples: int) -> list[float]:
    """enqueue -> claim (s, coordd's clock) of P0 noop jobs, each enqueued as soon as
    `wait_job` says the previous one ended (the first three warm the worker up)."""
    lat = []
    async with Client(sock, timeout=60) as p:
        for k in range(samples + 3):
            job = (await p.enqueue(kind="noop", required_role="cpu", priority=0,
                                   payload={"k": k})).job_id
            done = await p.wait_job(job, 30)
            if not done.terminal or done.job.status != "succeeded":
                raise RuntimeError(f"noop job {job}: {done.job.status} {done.job.last_error}")
            if k >= 3:
                view = await p.get_job(job)
                claimed = next(e.at for e in view.events if e.to_status == "running")
                lat.append(claimed - view.created_at)
    return lat


def claim_after_end(workdir: Path, samples: int) -> dict:
    """Part 5 on both worker shapes: p50/p99 in ms."""
    out = {}
    for shape, sleeper in (("one_kind", False), ("kinds", True)):
        lat = with_worker(workdir / f"after-{shape}", lambda sock: after_end(sock, samples),
                          sleeper)
        out[f"after_end_{shape}_p50_ms"] = 1e3 * pct(lat, 50)
        out[f"after_end_{shape}_p99_ms"] = 1e3 * pct(lat, 99)
    return out


def with_worker(workdir: Path, drive, sleeper: bool = True):
    """Run `drive(socket)` (a coroutine function) against a fresh coordd and one real
    coord-worker (`noop`, and `sleeper` too when `sleeper`); its result."""
    d = Daemon(workdir, probe=False)
    d.workdir.mkdir(parents=True)
    d.start()
    worker = None
    try:
        cfg = d.workdir / "worker.toml"
        cfg.write_text(_worker_toml(d.workdir / "work", sleeper))
        readings = d.workdir / "readings.json"
        readings.write_text(json.dumps(READINGS))
        with open(d.workdir / "worker.log", "wb") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "worker", "--worker-id", "bench-w1", "--roles", "cpu",
                 "--socket", d.socket, "--config", str(cfg), "--readings-override",
                 str(readings)], stdout=log, stderr=log, cwd=str(REPO))
        return uvloop.run(drive(d.socket))
    finally:
        if worker is not None and worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                worker.kill()
        d.stop()


# ---------------------------------------------------------------- 4. idle CPU


async def _park(sock: str, n: int, ready: asyncio.Event, stop: asyncio.Event) -> None:
    clients = [Client(sock, timeout=PARK_WAIT_S + 30) for _ in range(
        max(1, -(-n // CLAIMS_PER_CONNECTION)))]
    for c in clients:
        await c.connect()
    await asyncio.gather(*(clients[i % len(clients)].heartbeat(f"idle{i}", ["cpu"], READINGS)
                           for i in range(n)))
    calls = [asyncio.ensure_future(clients[i % len(clients)].claim(
        f"idle{i}", lease_s=60, wait_s=PARK_WAIT_S)) for i in range(n)]
    await asyncio.sleep(1.0)  # all parked
    ready.set()
    await stop.wait()
    for c in calls:
        c.cancel()
    for c in clients:
        await c.close()


def idle_cpu(workdir: Path, n: int, idle_s: float) -> dict:
    d = Daemon(workdir / "idle", probe=False)
    d.workdir.mkdir(parents=True)
    d.start()
    try:
        async def run() -> dict:
            ready, stop = asyncio.Event(), asyncio.Event()
            parker = asyncio.create_task(_park(d.socket, n, ready, stop))
            await ready.wait()
            d.mark_cpu()
            t0 = time.monotonic()
            await asyncio.sleep(idle_s)
            cpu = d.cpu_since_mark() / (time.monotonic() - t0)
            stop.set()
            await parker
            return {"idle_cpu_pct": 100 * cpu, "parked": n}
        return uvloop.run(run())
    finally:
        d.stop()


# ---------------------------------------------------------------- driver


def one_round(workdir: Path, samples: int, parked: int, idle_s: float) -> dict:
    d = Daemon(workdir / "claim", probe=False)
    d.workdir.mkdir(parents=True)
    d.start()
    try:
        out = uvloop.run(claim_latency(d.socket, samples))
    finally:
        d.stop()
    out.update(_spawn_pcts(workdir, max(20, samples // 4)))
    marks = workdir / "marks"
    marks.mkdir(parents=True)
    out.update(with_worker(workdir / "worker", lambda sock: worker_latencies(
        sock, max(20, samples // 4), max(10, samples // 10), marks)))
    out["result_over_spawn_p50_ms"] = out["result_p50_ms"] - out["bare_spawn_p50_ms"]
    out.update(idle_cpu(workdir, parked, idle_s))
    out.update(claim_after_end(workdir, max(20, samples // 4)))
    return out


def _spawn_pcts(workdir: Path, n: int) -> dict:
    """Bare spawn -> exit of the model, per spawn (p50/p99 in ms)."""
    d = workdir / "bare_each"
    d.mkdir(parents=True)
    env = {**os.environ, "COORD_RESULT": str(d / "result.json")}
    argv = model_argv()
    lat = []
    with open(d / "out.log", "wb") as out:
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                             cwd=str(d), env=env, start_new_session=True).wait()
            lat.append(time.perf_counter() - t0)
    return {"bare_spawn_p50_ms": 1e3 * pct(lat, 50), "bare_spawn_p99_ms": 1e3 * pct(lat, 99)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.push", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=200, help="enqueue -> claim samples a round")
    ap.add_argument("--parked", type=int, default=1000, help="parked claims for the CPU figure")
    ap.add_argument("--idle-s", type=float, default=10.0, help="seconds the CPU is measured")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args(argv)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="coordd-bench-push-") as tmp:
        for r in range(args.rounds):
            rnd = one_round(Path(tmp) / f"r{r}", args.samples, args.parked, args.idle_s)
            rounds.append(rnd)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in rnd.items()
                                                  if isinstance(v, float)), flush=True)
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]
           if isinstance(rounds[0][k], (int, float))}
    print("\nmedians over rounds (target):")
    for k, v in med.items():
        target = TARGETS.get(k)
        mark = "" if target is None else f"  (<= {target:g}: {'ok' if v <= target else 'MISSED'})"
        print(f"  {k:28s} {v:10.2f}{mark}")
    if args.out:
        Path(args.out).write_text(json.dumps({"rounds": rounds, "medians": med}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
