"""Enrolment (issue 18): a one-time token, a key made on the worker, a CSR signed by
coordd; a replayed token is refused. Real coordd, coordctl and coord-worker processes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from coordd import errors
from coordd.net import pki
from coordd.client import Client
from coordd.transport import Connector, TlsFiles
from tests.integration.fleet_certs import free_port, make_fleet

COOL = {"memory_used_pct": 10.0, "temperature_c": 40.0, "on_battery": False, "user_idle_s": 9999.0}


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def enrolling(daemon_factory, tmp_path):
    fleet = make_fleet(tmp_path, time.time())
    eport = free_port()
    d = daemon_factory(fleet.config(f'listen_enroll = "127.0.0.1:{eport}"\n'
                                    f'tls_ca_key = "{fleet.ca_dir / "ca.key"}"\n'))
    d.start()
    return fleet, d, eport


async def test_enrolment_token_works_once(enrolling, tmp_path):
    fleet, d, eport = enrolling
    made = run("coordctl", "--socket", d.socket, "--json", "token", "create", "--worker", "gpu3",
               "--ttl", "1h")
    assert made.returncode == 0, made.stderr
    tok = json.loads(made.stdout)
    fp = pki.fingerprint((fleet.ca_dir / "ca.pem").read_bytes())
    assert tok["ca_sha256"] == fp and tok["worker_id"] == "gpu3"
    # a wrong pin: nothing is sent, the token stays good
    bad = run("worker", "enroll", "--server", f"127.0.0.1:{eport}", "--token", tok["token"],
              "--ca-sha256", "00" * 32, "--out", str(tmp_path / "bad"))
    assert bad.returncode == 1 and "not sending the token" in bad.stderr
    out = tmp_path / "tls"
    ok = run("worker", "enroll", "--server", f"127.0.0.1:{eport}", "--token", tok["token"],
             "--ca-sha256", fp, "--out", str(out))
    assert ok.returncode == 0, ok.stderr
    assert "enrolled as worker gpu3" in ok.stdout
    # the names `coordctl ca issue --worker ID` writes and coord-worker-fleet.conf loads
    for name in ("worker-gpu3.key", "worker-gpu3.pem", "ca.pem"):
        assert stat.S_IMODE(os.stat(out / name).st_mode) == 0o600
    assert pki.cert_identity((out / "worker-gpu3.pem").read_bytes()) == ("gpu3", None)
    files = TlsFiles(cert=str(out / "worker-gpu3.pem"), key=str(out / "worker-gpu3.key"),
                     ca=str(out / "ca.pem"))
    async with Client(connector=Connector(f"tls://127.0.0.1:{fleet.port}", files), timeout=5) as c:
        assert (await c.heartbeat("gpu3", ["gpu"], COOL)).now > 0
        with pytest.raises(errors.PermissionDenied):
            await c.heartbeat("gpu4", ["gpu"], COOL)
    again = run("worker", "enroll", "--server", f"127.0.0.1:{eport}", "--token", tok["token"],
                "--ca-sha256", fp, "--out", str(tmp_path / "again"))
    assert again.returncode == 1 and "already used" in again.stderr
    assert "enrolled worker gpu3" in d.log()


async def test_enrolment_listener_serves_only_enrolment(enrolling):
    fleet, d, eport = enrolling
    from worker.enroll import _unverified
    async with Client(connector=Connector(f"tls://127.0.0.1:{eport}", context=_unverified()),
                      timeout=5) as c:
        with pytest.raises(errors.PermissionDenied, match="not served here"):
            await c.status()
        with pytest.raises(errors.PermissionDenied, match="not served here"):
            await c.heartbeat("wa", ["cpu"], COOL)
        with pytest.raises(errors.PermissionDenied, match="unknown token"):
            await c.call("enroll", {"token": "cdt_nope", "csr_pem": pki.make_csr(
                pki.new_key(), "x").decode()})
    # token_create is an admin method: not for a worker certificate over TCP
    async with Client(connector=fleet.connector("worker-wa"), timeout=5) as c:
        with pytest.raises(errors.PermissionDenied, match="admin"):
            await c.call("token_create", {"worker_id": "wa"})


def _sighup_line(log: Callable[[], str], signal_to: Callable[[], None]) -> list[str]:
    """SIGHUP coordd, wait for its `SIGHUP:` line; return the lines the reload logged."""
    before = log().count("SIGHUP")
    start = len(log())
    signal_to()
    deadline = time.monotonic() + 10
    while log().count("SIGHUP") == before and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # any other line of the same reload
    return log()[start:].splitlines()


def assert_reloads_cleanly(lines: list[str]) -> None:
    """The reload of a daemon with `listen_enroll` logged its one line and no error."""
    assert any("SIGHUP: reloaded the TLS certificates" in ln for ln in lines), lines
    assert not [ln for ln in lines if " ERROR " in ln or "Traceback" in ln], lines


async def test_sighup_with_the_enrolment_listener_reloads_both(enrolling):
    """Issue 31 item 3: the enrolment listener has no client CA; SIGHUP logged a TypeError."""
    fleet, d, eport = enrolling
    lines = _sighup_line(lambda: Path(d.log_path).read_text(errors="replace"),
                         lambda: d.proc.send_signal(signal.SIGHUP))
    assert_reloads_cleanly(lines)
    assert d.proc.poll() is None
    async with Client(connector=fleet.connector("worker-wa"), timeout=5) as c:
        assert (await c.heartbeat("wa", ["cpu"], COOL)).now > 0


async def test_the_commands_printed_run_as_printed(enrolling, tmp_path):
    """Issue 31 item 4: `token create` prints the `enroll` command and `enroll` the worker's
    command; both run as printed (no `HOST:PORT`/`PORT`/`...` left to fill in), and the
    second enrolment in the same folder keeps the identical ca.pem."""
    fleet, d, eport = enrolling
    made = run("coordctl", "--socket", d.socket, "token", "create", "--worker", "gpu5")
    assert made.returncode == 0, made.stderr
    assert re.search(r"expires \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", made.stdout), made.stdout
    enroll = shlex.split(made.stdout.splitlines()[-1])
    assert enroll[:2] == ["coord-worker", "enroll"], made.stdout
    assert enroll[enroll.index("--server") + 1].endswith(f":{eport}"), made.stdout
    out = tmp_path / "tls"
    out.mkdir(mode=0o700)
    (out / "ca.pem").write_bytes((fleet.ca_dir / "ca.pem").read_bytes())  # as if enrolled before
    # the printed host is this host's name; the test dials loopback (same port)
    enroll[enroll.index("--server") + 1] = f"127.0.0.1:{eport}"
    ok = run("worker", *enroll[1:], "--out", str(out), "--roles", "cpu,gpu")
    assert ok.returncode == 0, ok.stderr
    line = ok.stdout.strip().splitlines()[-1]
    assert "PORT" not in ok.stdout and "..." not in ok.stdout, ok.stdout
    argv = shlex.split(line)
    assert argv[0] == "coord-worker" and argv[argv.index("--cert") + 1] == str(out / "worker-gpu5.pem")
    assert argv[argv.index("--connect") + 1] == f"tls://127.0.0.1:{fleet.port}"
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    env.pop("STATE_DIRECTORY", None)
    log = tmp_path / "gpu5.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "worker", *argv[1:]], env=env,
                                stdout=fh, stderr=fh)
    try:
        async with Client(d.socket, timeout=5) as c:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and proc.poll() is None:
                seen = {w.worker_id: w for w in (await c.workers()).workers}
                if "gpu5" in seen:
                    assert set(seen["gpu5"].roles) == {"cpu", "gpu"}
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"gpu5 never heartbeat: {proc.poll()}, {log.read_text()}")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log.read_text()
