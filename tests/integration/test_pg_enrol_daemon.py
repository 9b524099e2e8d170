"""Enrolment through a real coordd on the PostgreSQL store (issue 20): `coordctl token
create`, `coord-worker enroll` over the enrolment listener, the certificate accepted on
mTLS, a replayed token refused."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from coordd import errors
from coordd.net import pki
from coordd.client import Client
from coordd.transport import Connector, TlsFiles
from tests.integration.fleet_certs import free_port, make_fleet
from tests.integration.test_enrol import COOL, _sighup_line, assert_reloads_cleanly, run
from tests.integration.test_pg_daemon import DAEMON_CFG, Coordd, pg_db  # noqa: F401 (fixture)


@pytest.fixture
def enrolling(pg_db: str, tmp_path: Path) -> Any:  # noqa: F811 (pg_db is the fixture)
    fleet = make_fleet(tmp_path, time.time())
    eport = free_port()
    cfg = tmp_path / "coordd.toml"
    cfg.write_text(DAEMON_CFG + fleet.config(f'listen_enroll = "127.0.0.1:{eport}"\n'
                                             f'tls_ca_key = "{fleet.ca_dir / "ca.key"}"\n'))
    d = Coordd(pg_db, str(tmp_path / "c.sock"), str(cfg), tmp_path / "coordd.log")
    yield fleet, d.start(), eport
    d.stop()


async def test_enrolment_on_the_postgres_daemon_signs_once(enrolling, tmp_path):
    fleet, d, eport = enrolling
    await d.wait_serving()
    made = run("coordctl", "--socket", d.socket, "--json", "token", "create", "--worker",
               "gpu3", "--ttl", "1h")
    assert made.returncode == 0, (made.stderr, d.log())
    tok = json.loads(made.stdout)
    fp = pki.fingerprint((fleet.ca_dir / "ca.pem").read_bytes())
    assert tok["ca_sha256"] == fp and tok["worker_id"] == "gpu3"
    out = tmp_path / "tls"
    ok = run("worker", "enroll", "--server", f"127.0.0.1:{eport}", "--token", tok["token"],
             "--ca-sha256", fp, "--out", str(out))
    assert ok.returncode == 0, (ok.stderr, d.log())
    assert pki.cert_identity((out / "worker-gpu3.pem").read_bytes()) == ("gpu3", None)
    files = TlsFiles(cert=str(out / "worker-gpu3.pem"), key=str(out / "worker-gpu3.key"),
                     ca=str(out / "ca.pem"))
    async with Client(connector=Connector(f"tls://127.0.0.1:{fleet.port}", files),
                      timeout=5) as c:
        assert (await c.heartbeat("gpu3", ["gpu"], COOL)).now > 0
        with pytest.raises(errors.PermissionDenied):
            await c.heartbeat("gpu4", ["gpu"], COOL)
    again = run("worker", "enroll", "--server", f"127.0.0.1:{eport}", "--token", tok["token"],
                "--ca-sha256", fp, "--out", str(tmp_path / "again"))
    assert again.returncode == 1 and "already used" in again.stderr
    bad = run("coordctl", "--socket", d.socket, "token", "create", "--worker", "bad\nid")
    assert bad.returncode == 1 and "bad_request" in bad.stderr
    assert "enrolled worker gpu3" in d.log()


async def test_sighup_with_the_enrolment_listener_on_postgres(enrolling):
    """Issue 31 item 3, on the PostgreSQL store: SIGHUP reloads both listeners, no error."""
    fleet, d, eport = enrolling
    await d.wait_serving()
    assert_reloads_cleanly(_sighup_line(d.log, lambda: d.proc.send_signal(signal.SIGHUP)))
    assert d.proc.poll() is None
