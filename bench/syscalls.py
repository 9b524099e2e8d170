"""`python -m bench.syscalls`: system calls, context switches and CPU per job of a drain,
coordd's and each load process's (issue 30: where a lone request's time goes).

A plain coordd of this tree (`python -m coordd`, no probe) gets N batch-enqueued jobs,
then C connections drain them as `bench.run` does (bench.load; one load process for one
connection, two otherwise). Printed per job: the drain's rate, coordd's CPU (user and
system) and context switches (voluntary: it waited; involuntary: it was preempted) over
the drain, the load processes' CPU; with `--strace`, a second run under `strace -c -f`
(coordd and each load process, attached at the gate) counts each system call per job.
Call counts are steady from run to run; times and rates are not on a shared machine, and
strace slows everything it traces. To compare revisions, run it in a checkout of each.

    python -m bench.syscalls --jobs 3000 --clients 1 --strace
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from bench.daemon import Daemon
from bench.load import run_phase


def drain(work: Path, n: int, clients: int, strace: bool) -> dict:
    """One fresh daemon, N jobs, one drain; the figures per job (see the module doc)."""
    d = Daemon(work / "d", probe=False)
    d.workdir.mkdir(parents=True)
    d.start()
    mark: dict = {}
    tracers: list[subprocess.Popen] = []

    def on_go() -> None:
        loads = [p for p in psutil.Process().children() if p.pid != d.proc.pid]
        if strace:
            for name, pid in [("coordd", d.proc.pid)] + [(f"load{i}", p.pid)
                                                        for i, p in enumerate(loads)]:
                tracers.append(subprocess.Popen(
                    ["strace", "-c", "-f", "-o", str(work / f"strace_{name}.txt"),
                     "-p", str(pid)], stderr=subprocess.DEVNULL))
            time.sleep(1.0)  # attached before the gate opens
        mark["cpu"], mark["csw"] = d.ps.cpu_times(), d.ps.num_ctx_switches()

    try:
        run_phase("enqueue_batch", d.socket, 2, 1, n_jobs=n, batch=500)
        r = run_phase("drain", d.socket, clients, 1 if clients == 1 else 2, tag="s",
                      on_go=on_go)
        cpu, csw = d.ps.cpu_times(), d.ps.num_ctx_switches()
    finally:
        for t in tracers:
            t.send_signal(signal.SIGINT)
            t.wait()
        d.stop()
    c0, s0, done = mark["cpu"], mark["csw"], r.done
    out = {"jobs": done, "rpcs_per_job": r.rpcs / done, "jobs_s": r.rate,
           "coordd_user_us": 1e6 * (cpu.user - c0.user) / done,
           "coordd_sys_us": 1e6 * (cpu.system - c0.system) / done,
           "coordd_vcsw": (csw.voluntary - s0.voluntary) / done,
           "coordd_ivcsw": (csw.involuntary - s0.involuntary) / done,
           "load_cpu_us": 1e6 * r.client_cpu_s / done, "syscalls": {}}
    for f in sorted(work.glob("strace_*.txt")):
        calls = {}
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                calls[parts[-1]] = int(parts[3]) / done
        out["syscalls"][f.stem.removeprefix("strace_")] = calls
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.syscalls",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--strace", action="store_true", help="also count system calls (strace)")
    args = p.parse_args(argv)
    if args.strace and shutil.which("strace") is None:
        raise SystemExit("strace is not installed")
    runs = [False, True] if args.strace else [False]
    for traced in runs:
        with tempfile.TemporaryDirectory(prefix="coordd-syscalls-") as w:
            r = drain(Path(w), args.jobs, args.clients, traced)
        if not traced:
            print(f"{args.clients} conn: {r['jobs_s']:,.0f} jobs/s, {r['rpcs_per_job']:.2f} "
                  f"RPC/job | coordd CPU/job {r['coordd_user_us']:.0f} us user + "
                  f"{r['coordd_sys_us']:.0f} us sys, context switches/job "
                  f"{r['coordd_vcsw']:.2f} voluntary {r['coordd_ivcsw']:.2f} involuntary | "
                  f"load CPU/job {r['load_cpu_us']:.0f} us")
            continue
        for who, calls in r["syscalls"].items():
            shown = ", ".join(f"{k} {v:.2f}" for k, v in sorted(
                calls.items(), key=lambda kv: -kv[1]) if v >= 0.01)
            print(f"  syscalls/job {who}: {sum(calls.values()):.2f} ({shown})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
