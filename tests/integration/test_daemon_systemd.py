"""coordd under systemd as whole processes: socket activation (LISTEN_FDS), sd_notify
READY/STOPPING and watchdog pings, metrics over HTTP; the rest of the lifecycle is in
test_daemon_lifecycle.py."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import pytest

from coordd.client import Client
from tests.integration.test_daemon_lifecycle import EXIT_TIMEOUT_S, wait_exit

# ------------------------------------------------------------------ systemd integration


async def _status_eventually(path: str, timeout: float = 15.0):
    async with Client(path, timeout=timeout) as c:
        return await c.status()


@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None,
                    reason="systemd-socket-activate not installed")
async def test_listen_fds_under_systemd_socket_activate(tmp_path):
    sock = tmp_path / "act.sock"
    db = tmp_path / "act.db"
    log = open(tmp_path / "act.log", "wb")
    proc = subprocess.Popen(
        ["systemd-socket-activate", "-l", str(sock), sys.executable, "-m", "coordd",
         "--db", str(db), "--socket", str(sock)], stdout=log, stderr=log)
    log.close()
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            await asyncio.sleep(0.02)
        st = await _status_eventually(str(sock))  # the first connection starts coordd
        assert st.workers == 0
        async with Client(str(sock)) as c:
            await c.enqueue(kind="k", required_role="cpu", priority=1, payload=None)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, EXIT_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = (tmp_path / "act.log").read_text(errors="replace")
    assert "Traceback" not in text
    assert sock.exists(), "coordd removed a socket that systemd owns"
    assert not (tmp_path / "act.sock.lock").exists(), "an activated coordd takes no lock"


async def test_listen_fds_prebound_socket(tmp_path):
    sock_path = tmp_path / "pre.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_path))
    listener.listen(16)
    wrapper = ("import os, sys; os.dup2(int(sys.argv[1]), 3); "
               "os.environ['LISTEN_PID'] = str(os.getpid()); os.environ['LISTEN_FDS'] = '1'; "
               "os.execv(sys.executable, [sys.executable, '-m', 'coordd', *sys.argv[2:]])")
    log = open(tmp_path / "pre.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", wrapper, str(listener.fileno()), "--db", str(tmp_path / "p.db"),
         "--socket", str(sock_path)], pass_fds=[listener.fileno()], stdout=log, stderr=log)
    log.close()
    listener.close()  # only coordd holds it now
    try:
        st = await _status_eventually(str(sock_path))
        assert st.active_leases == 0
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, EXIT_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert sock_path.exists(), "coordd removed an activated socket"
    text = (tmp_path / "pre.log").read_text(errors="replace")
    assert "Traceback" not in text and "coordd stopped" in text


async def test_sd_notify_ready_after_serving_and_stopping(daemon_factory, tmp_path):
    notify_path = tmp_path / "notify"
    n = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    n.bind(str(notify_path))
    n.settimeout(15)
    try:
        d = daemon_factory()
        d.env["NOTIFY_SOCKET"] = str(notify_path)
        d.start(wait=False)
        msg = (await asyncio.to_thread(n.recv, 4096)).decode()
        assert "READY=1" in msg.split("\n")
        async with Client(d.socket, timeout=5) as c:  # serving by the time READY=1 arrives
            await c.status()
        d.proc.send_signal(signal.SIGTERM)
        msg = (await asyncio.to_thread(n.recv, 4096)).decode()
        assert "STOPPING=1" in msg.split("\n")
        assert await asyncio.to_thread(wait_exit, d) == 0
    finally:
        n.close()


async def test_watchdog_pings_while_the_writer_commits(daemon_factory, tmp_path):
    """With WatchdogSec set, WATCHDOG=1 comes every half period, each after a writer commit."""
    notify_path = tmp_path / "notify-wd"
    n = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    n.bind(str(notify_path))
    n.settimeout(15)
    try:
        d = daemon_factory(name="wd")
        d.env.update(NOTIFY_SOCKET=str(notify_path), WATCHDOG_USEC="200000")
        d.start(wait=False)
        seen: list[str] = []
        while seen.count("WATCHDOG=1") < 3:
            seen += (await asyncio.to_thread(n.recv, 4096)).decode().split("\n")
        assert "READY=1" in seen
        # another process takes the write lock: the writer is wedged, reads still work
        blocker = sqlite3.connect(d.db, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            n.settimeout(0.3)  # let a ping already past its commit arrive (bounded)
            drain_until = time.monotonic() + 0.6
            with contextlib.suppress(TimeoutError):
                while time.monotonic() < drain_until:
                    await asyncio.to_thread(n.recv, 4096)
            n.settimeout(1.0)
            with pytest.raises(TimeoutError):  # five periods without a ping
                await asyncio.to_thread(n.recv, 4096)
            async with Client(d.socket, timeout=5) as c:
                assert (await c.status()).workers == 0
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        n.settimeout(15)
        assert "WATCHDOG=1" in (await asyncio.to_thread(n.recv, 4096)).decode().split("\n")
        d.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(wait_exit, d) == 0
    finally:
        n.close()


async def test_metrics_over_http_on_loopback(daemon_factory):
    """With metrics_port set, /metrics on 127.0.0.1 serves the series; stop still exits 0."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families
    with socket.socket() as s:  # a free port on loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = daemon_factory(f"metrics_port = {port}\nreaper_interval_s = 0.2\n", name="m")
    d.start()
    async with Client(d.socket, timeout=5) as c:
        await c.enqueue(kind="k", required_role="cpu", priority=2)

    def scrape() -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return {(x.name, tuple(x.labels.items())): x.value
                    for f in text_string_to_metric_families(r.read().decode())
                    for x in f.samples}

    deadline = time.monotonic() + 10
    while scrape().get(("coordd_jobs", (("status", "waiting"),))) != 1:  # gauges refresh
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert d.stop() == 0
    assert "Traceback" not in d.log()
