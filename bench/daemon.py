"""Start and stop a real coordd process for a benchmark phase; read its CPU, RSS and writer stats."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 20.0
STATS_TIMEOUT_S = 5.0

# Claims must never be refused for a stale heartbeat during a long drain.
BENCH_CONFIG = "heartbeat_stale_s = 86400.0\n"


@dataclass
class Daemon:
    """One coordd process on `workdir`/coordd.db and .sock (probe = with writer stats)."""

    workdir: Path
    probe: bool = True
    proc: subprocess.Popen | None = None
    ps: psutil.Process | None = None
    _cpu0: float = 0.0
    extra: dict = field(default_factory=dict)
    config: str = ""  # more coordd.toml lines (after `base`)
    base: str = BENCH_CONFIG  # "" for coordd's own heartbeat_stale_s
    store: str = ""  # a postgresql:// DSN: coordd on the PostgreSQL store (else SQLite at db)

    @property
    def db(self) -> str:
        return str(self.workdir / "coordd.db")

    @property
    def socket(self) -> str:
        return str(self.workdir / "coordd.sock")

    @property
    def stats_file(self) -> str:
        return str(self.workdir / "writer_stats.json")

    def start(self) -> "Daemon":
        """Start coordd and wait until its socket answers."""
        cfg = self.workdir / "coordd.toml"
        cfg.write_text(self.base + self.config)
        args = ["--db", self.db, "--socket", self.socket, "--config", str(cfg)]
        if self.store:
            args += ["--store", self.store]
        if self.probe:
            argv = [sys.executable, "-m", "bench.probe", self.stats_file, "--", *args]
        else:
            argv = [sys.executable, "-m", "coordd", *args]
        log = open(self.workdir / "coordd.log", "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log,
                                     cwd=str(Path(__file__).resolve().parent.parent))
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"coordd exited {self.proc.returncode}: {self.log_tail()}")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                    c.connect(self.socket)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"coordd did not come up: {self.log_tail()}")
                time.sleep(0.02)
        self.ps = psutil.Process(self.proc.pid)
        self.mark_cpu()
        return self

    def stop(self) -> None:
        """SIGTERM and wait (SIGKILL after the timeout)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def mark_cpu(self) -> None:
        """Start a CPU-seconds interval now."""
        self._cpu0 = self.cpu_total()

    def cpu_total(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def cpu_since_mark(self) -> float:
        return self.cpu_total() - self._cpu0

    def rss_mb(self) -> tuple[float, float]:
        """(current RSS, peak RSS VmHWM) in MiB."""
        cur = self.ps.memory_info().rss / 2**20
        peak = cur
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024
        except OSError:
            pass
        return cur, peak

    def writer_stats(self) -> dict | None:
        """Ask the probe for the writer counters (None without the probe)."""
        if not self.probe:
            return None
        try:
            os.unlink(self.stats_file)
        except FileNotFoundError:
            pass
        self.proc.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + STATS_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                with open(self.stats_file) as f:
                    return json.load(f)
            except (FileNotFoundError, json.JSONDecodeError):
                time.sleep(0.01)
        return None

    def log_tail(self) -> str:
        try:
            return (self.workdir / "coordd.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""


def writer_delta(before: dict | None, after: dict | None) -> dict:
    """Writer figures for the interval between two probe dumps."""
    if not before or not after:
        return {"requests_per_commit": None, "commit_ms_mean": None, "commit_ms_p99": None,
                "queue_wait_ms_p50": None, "queue_wait_ms_p99": None, "max_batch": None}
    batches = after["batches"] - before["batches"]
    reqs = after["requests"] - before["requests"]
    commit_s = after["commit_s_total"] - before["commit_s_total"]
    n_new = min(batches, len(after["commit_times"]))
    recent = after["commit_times"][-n_new:] if n_new else []
    waits = after["waits"]
    return {
        "commits": batches,
        "requests": reqs,
        "requests_per_commit": reqs / batches if batches else None,
        "commit_ms_mean": 1e3 * commit_s / batches if batches else None,
        "commit_ms_p99": 1e3 * pct(recent, 99) if recent else None,
        "queue_wait_ms_p50": 1e3 * pct(waits, 50) if waits else None,
        "queue_wait_ms_p99": 1e3 * pct(waits, 99) if waits else None,
        "max_batch": after["max_batch"],
    }


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of `values`."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, int(round(q / 100 * len(s) + 0.5)) - 1))
    return s[k]
