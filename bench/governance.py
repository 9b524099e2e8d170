"""Governance of running work, timed end to end (issue 16): one coordd, one one-slot
`coord-worker`, a P3 model that steps until it is told to stop.

    python -m bench.governance [--rounds 10] [--heartbeat 1.0] [--grace 1.0] [--out FILE]

Each round: a P3 job starts; then
1. **readings -> SIGSTOP**: the readings-override file turns user-active; time until the
   model's process state is `T` (polled every 5 ms from /proc). Then idle again; time
   until it runs again (coordd's `resume_after_s` is set to 0 here, so this is the same
   trip). Compared with the worker's heartbeat interval (the expected bound: one interval).
2. **P0 enqueue -> P0 model start** while the P3 holds the slot: the P0's model writes its
   first-line `time.time()`; the P3 is vacated (SIGTERM, it exits 75 at once) and the
   freed slot is reserved for the P0. Compared with the kind's grace (the issue's bound:
   grace + 1 s).
All on this machine's wall clock. Ratios are the figures to compare across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.daemon import pct
from coordd.client import Client

IDLE = {"memory_used_pct": 10.0, "temperature_c": 40.0, "on_battery": False,
        "user_idle_s": 3600.0}
ACTIVE = {**IDLE, "user_idle_s": 1.0}
MODEL = """
import json, os, signal, sys, time
t = time.time()
p = json.load(open(os.environ["COORD_PAYLOAD"]))
open(p["mark"], "w").write(json.dumps({"t": t, "pid": os.getpid()}))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
end = time.time() + p.get("run_s", 0)
while time.time() < end:
    time.sleep(0.01)
open(os.environ["COORD_RESULT"], "w").write("{}")
"""
DAEMON_TOML = """reaper_interval_s = 0.5
preempt_min_runtime_s = 0
[gates.p3]
resume_after_s = 0
max_suspend_s = 3600
"""


def proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


async def until(check, timeout: float = 30.0) -> float:
    """Poll `check()` every 5 ms; return the wall time it first held."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("bench condition not reached")
        await asyncio.sleep(0.005)
    return time.time()


async def main(rounds: int, heartbeat_s: float, grace_s: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-gov-"))
    (tmp / "coordd.toml").write_text(DAEMON_TOML)
    (tmp / "model.py").write_text(MODEL)
    readings = tmp / "readings.json"
    readings.write_text(json.dumps(IDLE))
    sock = str(tmp / "coordd.sock")
    log = open(tmp / "coordd.log", "ab")
    daemon = subprocess.Popen([sys.executable, "-m", "coordd", "--db", str(tmp / "c.db"),
                               "--socket", sock, "--config", str(tmp / "coordd.toml")],
                              stdout=log, stderr=log)
    (tmp / "w.toml").write_text(
        f"lease_s = 30\nheartbeat_interval_s = {heartbeat_s}\ngrace_s = {grace_s}\n"
        f"claim_interval_s = 0.2\nwork_dir = {json.dumps(str(tmp / 'work'))}\n"
        f"[kinds.m]\nargv = {json.dumps([sys.executable, str(tmp / 'model.py')])}\nslots = 1\n")
    worker = None
    stop, cont, start = [], [], []
    try:
        await until(lambda: Path(sock).exists())
        await asyncio.sleep(0.3)  # bound before the database is open: requests then wait
        async with Client(sock, timeout=10) as c:
            worker = subprocess.Popen(
                [sys.executable, "-m", "worker", "--worker-id", "b1", "--roles", "cpu",
                 "--config", str(tmp / "w.toml"), "--socket", sock,
                 "--readings-override", str(readings)], stdout=log, stderr=log)
            for i in range(rounds):
                mark3, mark0 = tmp / f"p3-{i}", tmp / f"p0-{i}"
                await c.enqueue(kind="m", required_role="cpu", priority=3,
                                payload={"mark": str(mark3), "run_s": 3600})
                await until(mark3.exists)
                pid = json.loads(mark3.read_text())["pid"]
                t0 = time.time()
                readings.write_text(json.dumps(ACTIVE))
                stop.append(await until(lambda: proc_state(pid) == "T") - t0)
                t0 = time.time()
                readings.write_text(json.dumps(IDLE))
                cont.append(await until(lambda: proc_state(pid) not in ("T", "gone")) - t0)
                t0 = time.time()
                p0 = await c.enqueue(kind="m", required_role="cpu", priority=0,
                                     payload={"mark": str(mark0)})
                await until(lambda: mark0.exists() and mark0.stat().st_size > 0)
                start.append(json.loads(mark0.read_text())["t"] - t0)
                while (await c.get_job(p0.job_id)).status != "succeeded":
                    await asyncio.sleep(0.02)
                for j in (await c.list_jobs(priority=3)).jobs:  # clear the P3 for the next round
                    if j.status in ("waiting", "running"):
                        await c.cancel(j.job_id)
                await until(lambda: proc_state(pid) == "gone")
    finally:
        for p in (worker, daemon):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(15)
        log.close()
    out = {"rounds": rounds, "heartbeat_s": heartbeat_s, "grace_s": grace_s}
    for name, xs, ref in (("readings_to_sigstop_s", stop, heartbeat_s),
                          ("readings_to_sigcont_s", cont, heartbeat_s),
                          ("p0_enqueue_to_start_s", start, grace_s)):
        out[name] = {"p50": pct(xs, 50), "p99": pct(xs, 99), "ratio_p99_to_bound":
                     pct(xs, 99) / (ref if name != "p0_enqueue_to_start_s" else ref + 1.0)}
    return out


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--heartbeat", type=float, default=1.0)
    ap.add_argument("--grace", type=float, default=1.0)
    ap.add_argument("--out")
    a = ap.parse_args()
    res = asyncio.run(main(a.rounds, a.heartbeat, a.grace))
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    cli()
