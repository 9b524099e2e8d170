"""Helpers of the web view's tests: a coordd-web process, coordd filled with real data."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordd.client import SyncClient

START_TIMEOUT_S = 15.0
COOL = {"memory_used_pct": 30.0, "temperature_c": 40.0, "on_battery": False,
        "user_idle_s": 10_000.0}


@dataclass
class WebProc:
    """A coordd-web process: its base URL and, with actions on, the printed token."""

    proc: subprocess.Popen
    url: str
    token: str | None
    log_path: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_web(tmp: Path, socket: str, *args: str) -> WebProc:
    """Start `python -m coordd_web` on a free port; wait for its first line."""
    log_path = tmp / f"web-{time.monotonic_ns()}.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "coordd_web", "--socket", socket,
                             "--port", "0", "--log-level", "warning", *args],
                            stdout=subprocess.PIPE, stderr=log)
    log.close()
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    m = re.search(r"(http://\S+/)(?:\?token=(\S+))?", line)
    assert m, f"coordd-web said {line!r}: {log_path.read_text()}"
    url, token = m.group(1).rstrip("/"), m.group(2)
    deadline = time.monotonic() + START_TIMEOUT_S
    import httpx
    while True:
        try:
            httpx.get(url + "/robots.txt", timeout=1)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
    return WebProc(proc, url, token, log_path)


def fill(socket: str) -> dict[str, Any]:
    """Real data of every kind a page shows: jobs in several states and kinds, a worker
    with readings history and a held lease, a failed job, a workflow, an agent and a
    message. Returns the ids made."""
    out: dict[str, Any] = {}
    with SyncClient(socket, timeout=10) as c:
        out["jobs"] = [c.enqueue(kind="alpha" if i % 3 else "beta", required_role="cpu",
                                 priority=i % 4, payload={"n": i, "word": f"needle{i}"}).job_id
                       for i in range(12)]
        for pct in (30.0, 35.0, 50.0):
            c.heartbeat("w1", ["cpu"], {**COOL, "memory_used_pct": pct, "slots_total": 2})
        done = c.claim("w1", lease_s=60)
        c.complete(done.job.job_id, "w1", done.lease.token, {"ok": True})
        bad = c.claim("w1", lease_s=60)
        c.fail(bad.job.job_id, "w1", bad.lease.token, "it broke", retryable=False)
        held = c.claim("w1", lease_s=60)
        c.log_append(held.job.job_id, "w1", held.lease.token, "stderr", 0,
                     b"loading the model\n")
        out.update(succeeded=done.job.job_id, failed=bad.job.job_id, running=held.job.job_id)
        wf = c.workflow_submit({"name": "pair", "nodes": [
            {"name": "first", "kind": "k1", "required_role": "gpu"},
            {"name": "second", "kind": "k2", "required_role": "gpu",
             "needs": [{"node": "first", "policy": "run"}]}]})
        out["workflow"] = wf.workflow_id
        c.update_agent_status("agent-a", "thinking")
        c.send_message("agent-a", "agent-b", {"text": "hello b"})
        c.read_messages("agent-b", limit=5)
    return out
