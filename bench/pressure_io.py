"""`python -m bench.pressure_io`: coordd under connection, frame, reader and write pressure
(issue 21, findings 1, 2, 3 and 8), each scenario against this tree and, with
`--baseline REV`, against coordd at REV in the same run.

    python -m bench.pressure_io [--baseline main] [--quick] [--only fds,trickle,...]

Scenarios (each a function returning a dict of figures, for bench/pressure.py's table):
- fds: coordd under RLIMIT_NOFILE 1024 (soft = hard), 1,020 idle connections, a prune
  round every second: is coordd up after it, and what does `coordctl status` say?
- trickle: N connections each send a max-size frame but its last byte, then one byte
  every 2 s: coordd's RSS (peak and at the end) against max_inbound_bytes.
- slow_readers: 2 connections send 64 `get_job` of a job with a large result and never
  read: RSS while they hang, `status` latency for another client, RSS after they close.
- flood: 16 connections pipelining enqueues (64 in flight each) against a small writer
  queue while one worker heartbeats and renews its leases: holder calls refused.
- disk_full: coordd's database on a small tmpfs (needs root for the mount); 4 workers
  drain N jobs (claim -> complete with a 2 KiB result, retrying `unavailable` as the
  supervisor does); a filler takes every free byte mid-drain, holds it, then frees it:
  refusals by code, whether coordd stayed up, and after space returns every job
  succeeded exactly once with the result its worker sent.
Figures are taken on this machine, now; compare the two columns of one run, not runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import psutil

ROOT = Path(__file__).resolve().parent.parent


def _frame(obj: Any) -> bytes:
    body = msgspec.msgpack.encode(obj)
    return struct.pack(">I", len(body)) + body


class Coordd:
    """A coordd process from `src` (a tree holding coordd/) on a fresh folder."""

    def __init__(self, src: Path, config: str = "", nofile: int | None = None,
                 folder: Path | None = None) -> None:
        self.dir = folder or Path(tempfile.mkdtemp(prefix="coordd-pressure-"))
        self.sock = str(self.dir / "c.sock")
        (self.dir / "c.toml").write_text("heartbeat_stale_s = 86400.0\n" + config)
        env = {**os.environ, "PYTHONPATH": str(src)}
        limit = None if nofile is None else (nofile, nofile)
        self.log = open(self.dir / "c.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "coordd", "--db", str(self.dir / "c.db"), "--socket",
             self.sock, "--config", str(self.dir / "c.toml")], cwd=str(src), env=env,
            stdout=self.log, stderr=self.log,
            preexec_fn=None if limit is None else
            lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit))
        self.src = src
        deadline = time.monotonic() + 20
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"coordd did not come up: {self.log_text()}")
            time.sleep(0.05)
        self.ps = psutil.Process(self.proc.pid)

    def answers(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2)
                s.connect(self.sock)
                s.sendall(_frame({"id": 1, "method": "status", "params": {}}))
                return len(s.recv(4)) == 4
        except OSError:
            return False

    def rss_mb(self) -> tuple[float, float]:
        """(RSS now, peak RSS) in MiB."""
        cur = self.ps.memory_info().rss / 2**20
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return cur, int(line.split()[1]) / 1024
        return cur, cur

    def log_text(self) -> str:
        return (self.dir / "c.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _raise_own_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# ---------------------------------------------------------------- scenarios


def fds(src: Path, limit: int = 1024, idle: int = 1020, wait_s: float = 3.0) -> dict[str, Any]:
    """1,020 idle clients under limit 1024, prune rounds every second."""
    _raise_own_nofile()
    d = Coordd(src, "reaper_interval_s = 0.5\nprune_interval_s = 1.0\n", nofile=limit)
    conns = []
    try:
        for _ in range(idle):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(d.sock)
            conns.append(s)
        time.sleep(wait_s)
        res = subprocess.run([sys.executable, "-m", "coordctl", "--socket", d.sock, "status"],
                             capture_output=True, text=True, timeout=60, cwd=str(src),
                             env={**os.environ, "PYTHONPATH": str(src)})
        up = d.proc.poll() is None
        line = (res.stderr.strip().splitlines() or ["(ok)"])[-1][:90]
    finally:
        for s in conns:
            s.close()
        up_after = d.proc.poll() is None and d.answers()
        d.stop()
    return {"coordd_up": up, "up_after_close": up_after, "coordctl_status": line}


def trickle(src: Path, conns: int = 200, frame_mb: int = 16, seconds: float = 10.0,
            budget_mb: int = 256) -> dict[str, Any]:
    """N max-size frames sent but their last byte, then trickled."""
    _raise_own_nofile()
    frame = frame_mb << 20
    d = Coordd(src, f"max_frame_bytes = {frame}\nmax_inbound_bytes = {budget_mb << 20}\n"
               if _has(src, "max_inbound_bytes") else f"max_frame_bytes = {frame}\n")
    tail = 64  # bytes left to trickle: the frame stays incomplete for 128 s
    body = b"\x00" * (frame - tail)
    socks, refused = [], 0
    try:
        for _ in range(conns):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(30)
            s.connect(d.sock)
            try:
                s.sendall(struct.pack(">I", frame) + body)
                socks.append(s)
            except OSError:
                refused += 1
                s.close()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for s in list(socks):
                try:
                    s.send(b"\x00")
                except OSError:  # closed by coordd (refused, or past frame_timeout_s)
                    socks.remove(s)
                    refused += 1
            time.sleep(2.0)
        cur, peak = d.rss_mb()
    finally:
        for s in socks:
            s.close()
        d.stop()
    return {"conns": conns, "frame_mib": frame_mb, "refused": refused,
            "rss_mib": round(cur), "peak_rss_mib": round(peak), "budget_mib": budget_mb}


def slow_readers(src: Path, readers: int = 2, result_mb: int = 8, requests: int = 64,
                 hang_s: float = 4.0) -> dict[str, Any]:
    """Readers that never read `get_job` replies of a job with a large result."""
    d = Coordd(src, "max_result_bytes = 16777216\n")
    try:
        job_id = asyncio.run(_finished_job(d.sock, result_mb))
        req = b"".join(_frame({"id": i, "method": "get_job", "params": {"job_id": job_id}})
                       for i in range(1, requests + 1))
        socks = []
        for _ in range(readers):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(d.sock)
            s.sendall(req)
            socks.append(s)
        time.sleep(hang_s)
        cur, peak = d.rss_mb()
        status_ms = asyncio.run(_status_ms(d.sock, 20))
        for s in socks:
            s.close()
        time.sleep(2.0)
        after, _ = d.rss_mb()
    finally:
        d.stop()
    return {"readers": readers, "reply_mib": result_mb, "rss_mib": round(cur),
            "peak_rss_mib": round(peak), "rss_after_close_mib": round(after),
            "status_p50_ms": round(status_ms[0], 2), "status_max_ms": round(status_ms[1], 2)}


def flood(src: Path, producers: int = 16, seconds: float = 5.0,
          queue_max: int = 500) -> dict[str, Any]:
    """An enqueue flood against a small writer queue; a worker heartbeats and renews."""
    d = Coordd(src, f"writer_queue_max = {queue_max}\n")
    try:
        out = asyncio.run(_flood(d.sock, producers, seconds))
    finally:
        d.stop()
    return out


def disk_full(src: Path, jobs: int = 3000, workers: int = 4, size_mb: int = 48,
              full_s: float = 3.0, wal_limit_mb: int | None = None) -> dict[str, Any]:
    """A full disk in the middle of a drain (see the module doc), under coordd's default
    WAL size limit (64 MiB, more than the disk) unless `wal_limit_mb` is given: coordd
    before the WAL was bounded by the free space let the WAL grow into the space freed,
    and the disk stayed full."""
    mnt = Path(tempfile.mkdtemp(prefix="coordd-diskfull-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs",
                    str(mnt)], check=True, capture_output=True)
    try:
        d = Coordd(src, "" if wal_limit_mb is None else
                   f"wal_size_limit_bytes = {wal_limit_mb << 20}\n", folder=mnt)
        try:
            out = asyncio.run(_disk_full(d, mnt / "filler", jobs, workers, full_s))
            out["coordd_up"] = d.proc.poll() is None and d.answers()
            out["error_lines_logged"] = d.log_text().count(" ERROR ")
            conn = __import__("sqlite3").connect(str(mnt / "c.db"))
            try:
                rows = dict(conn.execute("SELECT job_id, result_json FROM jobs "
                                         "WHERE status = 'succeeded'").fetchall())
                out["quick_check"] = conn.execute("PRAGMA quick_check").fetchone()[0]
                events = conn.execute("SELECT count(*) FROM job_events WHERE "
                                      "to_status = 'succeeded'").fetchone()[0]
            finally:
                conn.close()
            sent = out.pop("_sent")
            out["succeeded"] = len(rows)
            out["stored_once_as_sent"] = (events == len(rows) == len(sent) and all(
                json.loads(rows[j]) == r for j, r in sent.items()))
        finally:
            d.proc.terminate()
            d.proc.wait(20)
            d.log.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    return out


async def _disk_full(d: Coordd, filler: Path, jobs: int, workers: int,
                     full_s: float) -> dict[str, Any]:
    from coordd import errors
    from coordd.client import Client
    refused: dict[str, int] = {}
    sent: dict[str, Any] = {}
    async with Client(d.sock, timeout=60) as c:
        for i in range(0, jobs, 500):
            await c.enqueue_batch([{"kind": "k", "required_role": "cpu", "priority": 1,
                                    "payload": {"i": j}} for j in range(i, min(jobs, i + 500))])

    async def call(fn: Any) -> Any:
        while True:
            try:
                return await fn()
            except (errors.Unavailable, errors.Overloaded) as exc:
                refused[exc.code] = refused.get(exc.code, 0) + 1
                await asyncio.sleep(0.05)

    async def worker(k: int) -> None:
        wid = f"w{k}"
        async with Client(d.sock, timeout=60) as c:
            await call(lambda: c.heartbeat(wid, ["cpu"], {"memory_used_pct": 10.0}))
            while True:
                got = await call(lambda: c.claim(wid, lease_s=600))
                if got.job is None:
                    return
                result = {"by": wid, "pad": "r" * 2048, "job": got.job.job_id}
                await call(lambda: c.complete(got.job.job_id, wid, got.lease.token, result))
                sent[got.job.job_id] = result

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    tasks = [asyncio.create_task(worker(k)) for k in range(workers)]
    while len(sent) < jobs // 3:
        await asyncio.sleep(0.01)
    before = len(sent)
    await asyncio.to_thread(_fill, filler)
    t_full = loop.time()
    await asyncio.sleep(full_s)
    during = len(sent) - before
    filler.unlink()
    t_free = loop.time()
    at_free = len(sent)
    while len(sent) == at_free and not all(t.done() for t in tasks):
        if loop.time() - t_free > RECOVER_WAIT_S:
            break
        await asyncio.sleep(0.005)
    first_after = loop.time() - t_free
    _done, pending = await asyncio.wait(tasks, timeout=RECOVER_WAIT_S)
    for t in pending:
        t.cancel()
    return {"jobs": jobs, "done_before_full": before, "done_while_full": during,
            "full_s": round(t_free - t_full, 2), "refused_by_code": refused,
            "first_complete_after_space_returned_s": round(first_after, 3),
            "drain_s": round(loop.time() - t0, 2), "recovered": not pending, "_sent": sent}


RECOVER_WAIT_S = 60.0  # after space returns, the drain must end within this


def _fill(filler: Path) -> None:
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass


# ---------------------------------------------------------------- helpers


def _has(src: Path, key: str) -> bool:
    return key in (src / "coordd" / "config.py").read_text()


async def _finished_job(sock: str, result_mb: int) -> str:
    from coordd.client import Client
    async with Client(sock, timeout=60) as c:
        await c.heartbeat("w", ["cpu"], {"memory_used_pct": 10.0})
        job = await c.enqueue(kind="k", required_role="cpu", priority=0, payload={})
        got = await c.claim("w", lease_s=600)
        await c.complete(job.job_id, "w", got.lease.token, {"blob": "x" * (result_mb << 20)})
        return job.job_id


async def _status_ms(sock: str, n: int) -> tuple[float, float]:
    from coordd.client import Client
    loop = asyncio.get_running_loop()
    times = []
    async with Client(sock, timeout=60) as c:
        for _ in range(n):
            t = loop.time()
            await c.status()
            times.append((loop.time() - t) * 1000)
    times.sort()
    return times[len(times) // 2], times[-1]


async def _flood(sock: str, producers: int, seconds: float) -> dict[str, Any]:
    from coordd import errors
    from coordd.client import Client
    stop = asyncio.Event()
    counts = {"enqueued": 0, "enqueue_refused": 0, "holder_calls": 0, "holder_refused": 0}

    async def producer(c: Client) -> None:
        async def one() -> None:
            try:
                await c.enqueue(kind="k", required_role="cpu", priority=2, payload={"x": 1})
                counts["enqueued"] += 1
            except errors.Overloaded:
                counts["enqueue_refused"] += 1
        while not stop.is_set():
            await asyncio.gather(*(one() for _ in range(64)))

    async def holder(c: Client, job_id: str, token: int) -> None:
        while not stop.is_set():
            for call in (lambda: c.heartbeat("w", ["cpu"], {"memory_used_pct": 10.0}),
                         lambda: c.renew(job_id, "w", token, 600)):
                try:
                    await call()
                    counts["holder_calls"] += 1
                except errors.Overloaded:
                    counts["holder_refused"] += 1
            await asyncio.sleep(0.05)

    clients = [Client(sock, timeout=60) for _ in range(producers + 1)]
    for c in clients:
        await c.connect()
    hc = clients[0]
    await hc.heartbeat("w", ["cpu"], {"memory_used_pct": 10.0})
    await hc.enqueue(kind="k", required_role="cpu", priority=0, payload={})
    got = await hc.claim("w", lease_s=600)
    tasks = [asyncio.create_task(producer(c)) for c in clients[1:]]
    tasks.append(asyncio.create_task(holder(hc, got.job.job_id, got.lease.token)))
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in clients:
        await c.close()
    return counts


SCENARIOS = {"fds": fds, "trickle": trickle, "slow_readers": slow_readers, "flood": flood,
             "disk_full": disk_full}
QUICK = {"fds": {"limit": 256, "idle": 252}, "trickle": {"conns": 60, "frame_mb": 4,
                                                         "budget_mb": 64, "seconds": 4.0},
         "slow_readers": {"result_mb": 2, "hang_s": 3.0}, "flood": {"seconds": 3.0},
         "disk_full": {"jobs": 1200, "full_s": 2.0}}


def _snapshot(rev: str) -> Path:
    snap = Path(tempfile.mkdtemp(prefix="coordd-pressure-src-"))
    archive = subprocess.run(["git", "archive", rev, "coordd", "coordctl", "worker"], cwd=ROOT,
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(snap)], input=archive, check=True)
    return snap


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pressure_io")
    p.add_argument("--baseline", help="also run every scenario on coordd at this git rev")
    p.add_argument("--quick", action="store_true", help="scaled-down sizes (~1 min)")
    p.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    sources = {"this tree": ROOT}
    if args.baseline:
        sources = {f"baseline {args.baseline}": _snapshot(args.baseline), **sources}
    results: dict[str, dict[str, Any]] = {}
    for name in args.only.split(","):
        fn = SCENARIOS[name]
        kw = QUICK.get(name, {}) if args.quick else {}
        for label, src in sources.items():
            try:
                fig = fn(src, **kw)
            except Exception as exc:  # a baseline that falls over is a figure too
                fig = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            results.setdefault(name, {})[label] = fig
            print(f"{name:13s} {label:16s} {json.dumps(fig)}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
