"""The real-worker test harness: a started coordd, real coord-worker processes configured
by a worker TOML, one small model script steered by its payload (MODEL), and the waits and
clean-up the tests share (`bench` over SQLite, `store_bench` over both stores,
`bench_over` for any DaemonProc). Used by tests/integration/test_worker.py and the other
whole-process files."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from coordd.client import Client

COOL = {"memory_used_pct": 30.0, "temperature_c": 40.0, "on_battery": False,
        "user_idle_s": 10_000.0}
DAEMON_FAST = """
reaper_interval_s = 0.3
heartbeat_stale_s = 5
backoff_base_s = 0.2
backoff_cap_s = 0.5
"""

# One model for every test, steered by its payload:
#   sleep (s, or a map worker_id -> s), exit (code), fail_times + counter (exit 75 that many
#   times first), child (a SIGTERM-ignoring helper in the same group), trap_term (ignore
#   SIGTERM), stderr (text), echo (copied into the result), pad (bytes of padding).
MODEL = textwrap.dedent("""
    import json, os, signal, subprocess, sys, time
    p = json.load(open(os.environ["COORD_PAYLOAD"]))
    me = os.environ["COORD_WORKER_ID"]
    pids = [os.getpid()]
    if p.get("child"):
        helper = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
        pids.append(subprocess.Popen([sys.executable, "-c", helper]).pid)
    if p.get("trap_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    piddir = os.environ.get("PIDDIR")
    if piddir:
        tmp = os.path.join(piddir, ".tmp-" + me)
        with open(tmp, "w") as fh:
            json.dump({"worker": me, "pids": pids}, fh)
        os.replace(tmp, os.path.join(piddir, os.environ["COORD_JOB_ID"] + "." + me))
    sys.stderr.write(p.get("stderr", ""))
    sys.stderr.flush()
    if "counter" in p:
        n = int(open(p["counter"]).read() or 0) + 1 if os.path.exists(p["counter"]) else 1
        open(p["counter"], "w").write(str(n))
        if n <= p.get("fail_times", 0):
            sys.exit(75)
    s = p.get("sleep", 0)
    time.sleep(s.get(me, 0) if isinstance(s, dict) else s)
    code = p.get("exit", 0)
    if code == 0:
        with open(os.environ["COORD_RESULT"], "w") as fh:
            json.dump({"echo": p.get("echo"), "worker": me, "pad": "x" * p.get("pad", 0),
                       "ignored": sorted(signal.Signals(n).name for n in p.get("ignored", [])
                                         if signal.getsignal(n) == signal.SIG_IGN)}, fh)
    sys.exit(code)
""")

WAIT_S = 20.0


@dataclass
class WorkerProc:
    """A coord-worker process under test."""

    worker_id: str
    proc: subprocess.Popen
    log_path: Path
    work_dir: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []


async def until(check: Callable[[], Awaitable[Any]], timeout: float = WAIT_S,
                what: str = "condition", every: float = 0.05) -> Any:
    """Poll `check()` every `every` seconds until it returns something true (returned),
    failing the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} not reached in {timeout}s"
        await asyncio.sleep(every)


def stop_workers(started: list[WorkerProc]) -> None:
    """Whatever a test left behind: each worker (continued if stopped) and its model trees."""
    for w in started:
        w.proc.send_signal(signal.SIGCONT)
        kids = w.descendants()
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait(10)
        for kid in kids:
            try:
                kid.kill()
            except psutil.NoSuchProcess:
                pass


@dataclass
class Bench:
    """What a worker test needs: the daemon, a client, the model script and a worker factory."""

    tmp: Path
    daemon: Any
    client: Client
    piddir: Path
    start_worker: Callable[..., WorkerProc]

    async def enqueue(self, payload: dict[str, Any], kind: str = "m", priority: int = 1,
                      **kw: Any) -> str:
        return (await self.client.enqueue(kind=kind, required_role="cpu", priority=priority,
                                          payload=payload, **kw)).job_id

    async def until(self, check: Callable[[], Awaitable[Any]], timeout: float = WAIT_S,
                    what: str = "condition") -> Any:
        return await until(check, timeout, what)

    async def status_is(self, job_id: str, *statuses: str, timeout: float = WAIT_S) -> Any:
        async def check() -> Any:
            job = await self.client.get_job(job_id)
            return job if job.status in statuses else None
        return await self.until(check, timeout, f"job {job_id} in {statuses}")

    async def model_pids(self, job_id: str, worker_id: str) -> list[int]:
        path = self.piddir / f"{job_id}.{worker_id}"

        async def check() -> Any:
            return json.loads(path.read_text())["pids"] if path.exists() else None
        return await self.until(check, what=f"model of {job_id} on {worker_id} started")


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def worker_toml(work_dir: Path, kinds: dict[str, dict[str, Any]], **settings: Any) -> str:
    base = {"lease_s": 2, "heartbeat_interval_s": 0.5, "grace_s": 0.5, "stop_timeout_s": 5,
            "claim_interval_s": 0.1, **settings}
    lines = [f"{k} = {json.dumps(v)}" for k, v in base.items()]
    lines.append(f"work_dir = {json.dumps(str(work_dir))}")
    for name, kind in kinds.items():
        lines.append(f"[kinds.{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in kind.items() if k != "env"]
        env = kind.get("env", {})
        lines.append("env = {" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + "}")
    return "\n".join(lines) + "\n"


@pytest.fixture
async def bench(daemon_factory, tmp_path):
    daemon = daemon_factory(DAEMON_FAST)
    daemon.start()
    async with bench_over(daemon, tmp_path) as b:
        yield b


@pytest.fixture
async def store_bench(store_daemon_factory, tmp_path):
    """A Bench over each store in turn (tests/integration/conftest.py
    `store_daemon_factory`)."""
    daemon = store_daemon_factory(DAEMON_FAST)
    daemon.start()
    async with bench_over(daemon, tmp_path) as b:
        yield b


@contextlib.asynccontextmanager
async def bench_over(daemon: Any, tmp_path: Path) -> AsyncIterator[Bench]:
    """A Bench over a started coordd (`daemon`, a DaemonProc); its workers are stopped
    when the block ends."""
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    piddir = tmp_path / "pids"
    piddir.mkdir()
    override = tmp_path / "readings.json"
    override.write_text(json.dumps(COOL))
    started: list[WorkerProc] = []

    def start_worker(worker_id: str = "w1", kind: dict[str, Any] | None = None,
                     extra_kinds: dict[str, dict[str, Any]] | None = None,
                     readings: Path | None = None, **settings: Any) -> WorkerProc:
        kinds = {"m": {"argv": [sys.executable, str(model)], "env": {"PIDDIR": str(piddir)},
                       **(kind or {})}, **(extra_kinds or {})}
        work_dir = tmp_path / f"work-{worker_id}"
        cfg = tmp_path / f"{worker_id}.toml"
        cfg.write_text(worker_toml(work_dir, kinds, **settings))
        log_path = tmp_path / f"{worker_id}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "worker", "--worker-id", worker_id, "--roles", "cpu",
                 "--socket", daemon.socket, "--config", str(cfg),
                 "--readings-override", str(readings or override)],
                stdout=log, stderr=log)
        w = WorkerProc(worker_id, proc, log_path, work_dir)
        started.append(w)
        return w

    try:
        async with Client(daemon.socket, timeout=10) as client:
            yield Bench(tmp_path, daemon, client, piddir, start_worker)
    finally:
        stop_workers(started)
