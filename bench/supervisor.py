"""Supervisor overhead: one `coord-worker` slot running a model process that exits at once.

    python -m bench.supervisor [--jobs 500] [--rounds 3] [--out FILE.json]

(also part of `python -m bench.run --supervisor`). One round:

1. **bare spawn** (baseline, no coordd): the same model argv spawned N times one after the
   other with `subprocess.Popen` (own session, stdin from /dev/null, output to a file, the
   result path in the environment like the worker gives it) and waited for. spawn/s =
   N / total; spawn -> model = Popen call to the model's first line (`time.time()` it
   writes to its result), which is the interpreter's own start-up.
2. **worker**: a fresh coordd (bench/daemon.py) with N jobs of kind `noop` batch-enqueued,
   then ONE `python -m worker` process (one kind, `slots = 1`, `--log-json`, readings
   override that passes every gate). jobs/s = N / (worker Popen to the last job's
   `succeeded` event); steady jobs/s = N / (first `claimed` event to the last `succeeded`
   event), which leaves out the worker's own start-up (imports, first heartbeat).
   Per job, all wall clock on this one machine:
   - claim -> spawn: the supervisor's own log records `claim` (logged as the claim reply
     is decoded, with the job id) and `model_start` (logged when the spawn returned, with
     the pid; the model reports its pid). JSON log `ts` is rounded to 1 ms.
   - claim -> model: coordd's `claimed` event `at` (the claim transaction's time) to the
     model's first line; includes the reply's trip, the supervisor's job folder
     (payload.json written and fsynced), the spawn and the interpreter start-up. Minus the
     bare spawn -> model median it estimates the supervisor's share.
   - exit -> succeeded: the supervisor's `model_exit` log (written after the reap and the
     final checkpoint scan) to coordd's `succeeded` event (result read, `complete` trip).
   - succeeded -> next claim: coordd's `succeeded` event of one job to the `claimed` event
     of the next (job folder removed, tree check, slot freed, next `claim` trip).
   The worker's and coordd's CPU seconds over the run (psutil) are given per job.
3. ratio = worker jobs/s / bare spawn/s of the same round (1.0 = no overhead).

The model is `{python} -S -c CODE`: no `site` import, so the interpreter start-up (common
to both sides) stays small next to what the supervisor adds.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import uvloop

from bench.daemon import Daemon, pct
from coordd.client import Client

DEFAULT_N = 500
ENQUEUE_BATCH = 500
KIND = "noop"
ROLES = "cpu"
READINGS = {"memory_used_pct": 10.0, "temperature_c": 40.0, "on_battery": False,
            "user_idle_s": 3600.0}
POLL_S = 0.05
WORKER_STOP_S = 30.0
# The model: its first line takes the time, then it writes {"t": start, "pid": pid} as its
# result (the supervisor needs a JSON result file to mark the job succeeded) and exits 0.
MODEL_CODE = ("import time;t=time.time();import os;f=open(os.environ['COORD_RESULT'],'w');"
              "f.write('{\"t\":%r,\"pid\":%d}'%(t,os.getpid()));f.close()")
MODEL_ARGV = ["{python}", "-S", "-c", MODEL_CODE]
REPO = Path(__file__).resolve().parent.parent


def model_argv() -> list[str]:
    return [sys.executable if a == "{python}" else a for a in MODEL_ARGV]


def worker_toml(work_dir: Path) -> str:
    """One kind, one slot; long lease and heartbeat (no renew or heartbeat during the run)."""
    return "\n".join([
        "lease_s = 60", "heartbeat_interval_s = 5", "grace_s = 1", "stop_timeout_s = 10",
        "claim_interval_s = 0.05", f"work_dir = {json.dumps(str(work_dir))}",
        f"[kinds.{KIND}]", f"argv = {json.dumps(MODEL_ARGV)}", "slots = 1", "timeout_s = 60",
        ""])


# ---------------------------------------------------------------- baseline


def bare_spawn(workdir: Path, n: int) -> dict:
    """Spawn the model N times sequentially, no coordd, no supervisor."""
    d = workdir / "bare_spawn"
    d.mkdir(parents=True)
    result = str(d / "result.json")
    env = {**os.environ, "COORD_RESULT": result}
    argv = model_argv()
    lat = []
    with open(d / "out.log", "wb") as out:
        t0 = time.perf_counter()
        for _ in range(n):
            w = time.time()
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                 cwd=str(d), env=env, start_new_session=True)
            if p.wait() != 0:
                raise RuntimeError(f"bare model exited {p.returncode}")
            lat.append(json.loads(Path(result).read_text())["t"] - w)
        wall = time.perf_counter() - t0
    return {"spawn_s": n / wall, "wall_s": wall,
            "spawn_to_model_ms_p50": 1e3 * pct(lat, 50),
            "spawn_to_model_ms_p99": 1e3 * pct(lat, 99)}


# ---------------------------------------------------------------- the worker


async def _enqueue(sock: str, n: int) -> list[str]:
    ids: list[str] = []
    async with Client(sock, timeout=60) as c:
        for lo in range(0, n, ENQUEUE_BATCH):
            jobs = [{"kind": KIND, "required_role": ROLES, "priority": 1, "payload": {"i": i}}
                    for i in range(lo, min(n, lo + ENQUEUE_BATCH))]
            ids += [j.job_id for j in (await c.enqueue_batch(jobs)).jobs]
    return ids


async def _wait_done(sock: str, n: int, worker: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with Client(sock, timeout=60) as c:
        while True:
            st = await c.status()
            if st.jobs.get("succeeded", 0) >= n:
                return
            if st.jobs.get("failed", 0):
                bad = (await c.list_jobs(status="failed", limit=1)).jobs
                raise RuntimeError(f"a job failed: {bad[0].last_error if bad else '?'}")
            if worker.poll() is not None:
                raise RuntimeError(f"coord-worker exited {worker.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {st.jobs.get('succeeded', 0)} of {n} succeeded "
                                   f"after {timeout:.0f}s")
            await asyncio.sleep(POLL_S)


async def _jobs(sock: str, ids: list[str]) -> list:
    async with Client(sock, timeout=60) as c:
        return [await c.get_job(j) for j in ids]


def _event_at(job, to_status: str) -> float:  # type: ignore[no-untyped-def]
    ats = [e.at for e in job.events if e.to_status == to_status and e.from_status != to_status]
    if not ats:
        raise RuntimeError(f"job {job.job_id}: no {to_status} event")
    return ats[-1]


def _parse_log(path: Path) -> tuple[dict[str, float], dict[int, float], dict[str, float]]:
    """From the worker's JSON log: claim ts by job id, model_start ts by pid, exit ts by job."""
    claims: dict[str, float] = {}
    starts: dict[int, float] = {}
    exits: dict[str, float] = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        act = rec.get("action")
        if act == "claim":
            claims[rec["job_id"]] = rec["ts"]
        elif act == "model_start":
            starts[rec["pid"]] = rec["ts"]
        elif act == "model_exit":
            exits[rec["job_id"]] = rec["ts"]
    return claims, starts, exits


def worker_run(workdir: Path, n: int, probe: bool = False) -> dict:
    """A fresh coordd with N queued noop jobs, then one coord-worker with one slot drains them."""
    d = Daemon(workdir / "supervisor", probe=probe)
    d.workdir.mkdir(parents=True)
    d.start()
    worker = None
    try:
        ids = uvloop.run(_enqueue(d.socket, n))
        cfg = d.workdir / "worker.toml"
        cfg.write_text(worker_toml(d.workdir / "work"))
        readings = d.workdir / "readings.json"
        readings.write_text(json.dumps(READINGS))
        log_path = d.workdir / "worker.log"
        d.mark_cpu()
        with open(log_path, "wb") as log:
            t_start = time.time()
            worker = subprocess.Popen(
                [sys.executable, "-m", "worker", "--worker-id", "bench-w1", "--roles", ROLES,
                 "--socket", d.socket, "--config", str(cfg), "--readings-override",
                 str(readings), "--log-json"],
                stdout=log, stderr=log, cwd=str(REPO))
        wps = psutil.Process(worker.pid)
        uvloop.run(_wait_done(d.socket, n, worker, timeout=30.0 + 0.5 * n))
        wt = wps.cpu_times()
        worker_cpu = wt.user + wt.system
        coordd_cpu = d.cpu_since_mark()
        worker.send_signal(signal.SIGTERM)
        worker.wait(WORKER_STOP_S)
        jobs = uvloop.run(_jobs(d.socket, ids))
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait(10)
        d.stop()
    claims, starts, exits = _parse_log(log_path)
    claimed = {j.job_id: _event_at(j, "running") for j in jobs}
    done = {j.job_id: _event_at(j, "succeeded") for j in jobs}
    model_t = {j.job_id: j.result["t"] for j in jobs}
    model_pid = {j.job_id: j.result["pid"] for j in jobs}
    last = max(done.values())
    first_claim = min(claimed.values())
    c2spawn = [starts[model_pid[j]] - claims[j] for j in ids
               if j in claims and model_pid[j] in starts]
    c2model = [model_t[j] - claimed[j] for j in ids]
    exit2done = [done[j] - exits[j] for j in ids if j in exits]
    order = sorted(ids, key=claimed.__getitem__)
    gaps = [claimed[b] - done[a] for a, b in itertools.pairwise(order)]
    if len(c2spawn) < n or len(exit2done) < n:
        print(f"  (worker log matched {len(c2spawn)} claim->spawn and {len(exit2done)} "
              f"exit->succeeded of {n} jobs)", flush=True)
    return {
        "jobs": n,
        "jobs_s": n / (last - t_start), "wall_s": last - t_start,
        "steady_jobs_s": n / (last - first_claim),
        "startup_s": first_claim - t_start,
        "claim_to_spawn_ms_p50": 1e3 * pct(c2spawn, 50) if c2spawn else None,
        "claim_to_spawn_ms_p99": 1e3 * pct(c2spawn, 99) if c2spawn else None,
        "claim_to_model_ms_p50": 1e3 * pct(c2model, 50),
        "claim_to_model_ms_p99": 1e3 * pct(c2model, 99),
        "exit_to_succeeded_ms_p50": 1e3 * pct(exit2done, 50) if exit2done else None,
        "exit_to_succeeded_ms_p99": 1e3 * pct(exit2done, 99) if exit2done else None,
        "succeeded_to_next_claim_ms_p50": 1e3 * pct(gaps, 50) if gaps else None,
        "succeeded_to_next_claim_ms_p99": 1e3 * pct(gaps, 99) if gaps else None,
        "cpu_ms_per_job_worker": 1e3 * worker_cpu / n,
        "cpu_ms_per_job_coordd": 1e3 * coordd_cpu / n,
    }


# ---------------------------------------------------------------- one round, medians


def one_round(workdir: Path, n: int, probe: bool = False) -> dict:
    """Bare spawn then the worker on the same N; figures plus ratios."""
    bare = bare_spawn(workdir, n)
    w = worker_run(workdir, n, probe)
    out = {"bare": bare, "worker": w,
           "ratio_jobs_vs_bare_spawn": w["jobs_s"] / bare["spawn_s"],
           "ratio_steady_vs_bare_spawn": w["steady_jobs_s"] / bare["spawn_s"],
           "claim_to_model_minus_bare_ms_p50":
               w["claim_to_model_ms_p50"] - bare["spawn_to_model_ms_p50"]}
    print_round(out)
    return out


def _f(x: float | None, nd: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def print_round(r: dict) -> None:
    b, w = r["bare"], r["worker"]
    print(f"bare spawn  : {b['spawn_s']:8.1f} spawns/s | spawn -> model p50 "
          f"{b['spawn_to_model_ms_p50']:.2f} p99 {b['spawn_to_model_ms_p99']:.2f} ms", flush=True)
    print(f"worker 1 slot: {w['jobs_s']:8.1f} jobs/s = {r['ratio_jobs_vs_bare_spawn']:.2f}x bare "
          f"spawn (steady {w['steady_jobs_s']:.1f}/s = {r['ratio_steady_vs_bare_spawn']:.2f}x; "
          f"start-up {w['startup_s']:.2f}s) | claim -> spawn p50 "
          f"{_f(w['claim_to_spawn_ms_p50'])} p99 {_f(w['claim_to_spawn_ms_p99'])} ms | "
          f"claim -> model p50 {w['claim_to_model_ms_p50']:.2f} p99 "
          f"{w['claim_to_model_ms_p99']:.2f} ms (minus bare: "
          f"{r['claim_to_model_minus_bare_ms_p50']:.2f}) | exit -> succeeded p50 "
          f"{_f(w['exit_to_succeeded_ms_p50'])} p99 {_f(w['exit_to_succeeded_ms_p99'])} ms | "
          f"succeeded -> next claim p50 {_f(w['succeeded_to_next_claim_ms_p50'])} p99 "
          f"{_f(w['succeeded_to_next_claim_ms_p99'])} ms | "
          f"cpu/job worker {w['cpu_ms_per_job_worker']:.2f} coordd "
          f"{w['cpu_ms_per_job_coordd']:.2f} ms", flush=True)


def medians(rounds: list[dict]) -> dict:
    """Median (min, max) of every figure over rounds, keys prefixed `supervisor_`."""
    keys: list[tuple[str, ...]] = []
    for k, v in rounds[0].items():
        if isinstance(v, dict):
            keys += [(k, kk) for kk, vv in v.items() if isinstance(vv, (int, float))]
        else:
            keys.append((k,))
    out = {}
    for path in keys:
        vals = []
        for r in rounds:
            v = r
            for p in path:
                v = v.get(p) if isinstance(v, dict) else None
            if v is not None:
                vals.append(v)
        if path[-1] == "jobs":
            continue
        name = "supervisor_" + "_".join(path)
        out[name] = ({"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
                     if vals else None)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.supervisor",
                                description="coord-worker overhead with a model that exits at once")
    p.add_argument("--jobs", type=int, default=DEFAULT_N, help=f"jobs per round (default {DEFAULT_N})")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="coordd-bench-sup-") as tmp:
        for i in range(args.rounds):
            print(f"\n== supervisor round {i + 1}: N={args.jobs}", flush=True)
            rd = Path(tmp) / f"round{i}"
            rd.mkdir()
            rounds.append(one_round(rd, args.jobs))
    m = medians(rounds)
    print("\n== medians over rounds (min..max)")
    width = max(len(k) for k in m)
    for k, v in m.items():
        print(f"{k:<{width}}  " + ("n/a" if v is None else
                                   f"{v['median']:>10.2f}   ({v['min']:.2f} .. {v['max']:.2f})"))
    if args.out:
        Path(args.out).write_text(json.dumps({"rounds": rounds, "medians": m}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
