"""The TCP listener with mutual TLS (issue 18): identities from certificates, refusals with
their logged reason, the deny-list, SIGHUP rotation with open connections kept. Real coordd
processes, real TLS on loopback, certificates from coordd.net.pki (what `coordctl ca` runs)."""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
import time
from pathlib import Path

import pytest

from coordd import errors
from coordd.net import pki
from coordd.client import Client, Disconnected
from coordd.transport import Connector
from tests.integration.fleet_certs import Fleet, make_fleet

COOL = {"memory_used_pct": 10.0, "temperature_c": 40.0, "on_battery": False, "user_idle_s": 9999.0}


@pytest.fixture
def fleet(tmp_path) -> Fleet:
    return make_fleet(tmp_path, time.time())


@pytest.fixture
def tls_daemon(daemon_factory, fleet):
    d = daemon_factory(fleet.config())
    d.start()
    return d


def until(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


async def test_worker_cert_acts_only_as_its_own_id(tls_daemon, fleet):
    async with Client(connector=fleet.connector("worker-wa"), timeout=5) as wa:
        hb = await wa.heartbeat("wa", ["cpu"], COOL)
        assert hb.now > 0
        assert (await wa.claim("wa")).job is None  # the same methods as on the Unix socket
        with pytest.raises(errors.PermissionDenied, match="worker wa.*as worker wb"):
            await wa.heartbeat("wb", ["cpu"], COOL)
        with pytest.raises(errors.PermissionDenied, match="worker wa.*as worker wb"):
            await wa.renew("j1", "wb", 1)
        with pytest.raises(errors.PermissionDenied, match="admin method"):
            await wa.enqueue(kind="k", required_role="cpu", priority=1, payload={})
        assert (await wa.status()).workers == 1  # the connection stays open after refusals
    async with Client(connector=fleet.connector("admin-ops"), timeout=5) as ops:
        job = await ops.enqueue(kind="k", required_role="cpu", priority=1, payload={})
    async with Client(connector=fleet.connector("worker-wa"), timeout=5) as wa:
        got = await wa.claim("wa", lease_s=30)
        assert got.job is not None and got.job.job_id == job.job_id
        await wa.complete(job.job_id, "wa", got.lease.token, {"ok": True})
    async with Client(tls_daemon.socket) as local:
        assert (await local.get_job(job.job_id)).status == "succeeded"


@pytest.mark.parametrize("stem,folder,reason", [
    ("worker-wa", "rogue", "unable to get local issuer certificate"),
    ("expired", None, "certificate has expired"),
    ("future", None, "certificate is not yet valid"),
    ("server-coordd", None, "unsuitable certificate purpose"),  # serverAuth only: no client
])
async def test_refused_certificates_are_logged_with_their_reason(tls_daemon, fleet, stem,
                                                                   folder, reason):
    conn = fleet.connector(stem, fleet.rogue_dir if folder else None)
    with pytest.raises(Disconnected):
        async with Client(connector=conn, timeout=3) as c:
            await c.status()
    assert until(lambda: reason in tls_daemon.log()), tls_daemon.log()
    assert "refused a TLS handshake" in tls_daemon.log()


async def test_no_client_certificate_is_refused(tls_daemon, fleet):
    ctx = ssl.create_default_context(cafile=fleet.ca)
    reader, writer = await asyncio.open_connection("127.0.0.1", fleet.port, ssl=ctx,
                                                   server_hostname="coordd")
    writer.write(b"\x00\x00\x00\x01\x80")
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError, ssl.SSLError)):
        await asyncio.wait_for(reader.readexactly(1), 5)
    writer.close()
    assert until(lambda: "PEER_DID_NOT_RETURN_A_CERTIFICATE" in tls_daemon.log()
                 or "peer did not return a certificate" in tls_daemon.log()), tls_daemon.log()


async def test_worker_refuses_a_server_without_the_pinned_name(daemon_factory, fleet):
    """A worker certificate (clientAuth, no DNS:coordd) cannot pose as coordd."""
    d = daemon_factory(fleet.config().replace("server-coordd", "worker-wb"))
    d.start()
    with pytest.raises(Disconnected, match="does not verify|certificate"):
        async with Client(connector=fleet.connector("worker-wa"), timeout=3) as c:
            await c.status()


async def test_sighup_rotates_certificates_and_keeps_open_connections(tls_daemon, fleet):
    async with Client(connector=fleet.connector("worker-wa"), timeout=5) as old:
        await old.heartbeat("wa", ["cpu"], COOL)
        rot = pki.issue(fleet.ca_dir, server="coordd-rotated", now=time.time())
        os.replace(rot.cert, fleet.ca_dir / "server-coordd.pem")
        os.replace(rot.key, fleet.ca_dir / "server-coordd.key")
        tls_daemon.proc.send_signal(signal.SIGHUP)
        assert until(lambda: "TLS certificates reloaded" in tls_daemon.log())
        for _ in range(50):  # the connection made before the swap keeps working
            await old.heartbeat("wa", ["cpu"], COOL)
        new = fleet.connector("worker-wb")
        reader, writer = await new.open()
        cert = writer.get_extra_info("ssl_object").getpeercert()
        writer.close()
        assert ("commonName", "coordd-rotated") in [kv for rdn in cert["subject"] for kv in rdn]
        assert (await old.status()).workers == 1
    assert tls_daemon.proc.poll() is None


async def test_deny_list_refuses_and_sighup_closes_open_connections(daemon_factory, fleet):
    d = daemon_factory(fleet.config('tls_deny_workers = ["wb"]\n'))
    d.start()
    with pytest.raises(errors.PermissionDenied, match="deny-list"):
        async with Client(connector=fleet.connector("worker-wb"), timeout=3) as wb:
            await wb.status()
    async with Client(connector=fleet.connector("worker-wa"), timeout=3) as wa:
        await wa.status()
        Path(d.config).write_text(fleet.config('tls_deny_workers = ["wb", "wa"]\n'))
        d.proc.send_signal(signal.SIGHUP)
        assert until(lambda: "closing the connection of worker wa" in d.log()), d.log()
        with pytest.raises((Disconnected, errors.PermissionDenied)):
            await wa.status()
            await wa.status()  # (the first may race the close)


async def test_connector_backs_off_with_full_jitter(fleet):
    """Nothing listens: each failed connect raises at once; the next waits a jittered,
    capped, growing backoff."""
    c = Connector(f"tls://127.0.0.1:{fleet.port}", fleet.files("worker-wa"),
                  backoff_base_s=0.2, backoff_cap_s=1.0)
    seen = []
    for _ in range(6):
        with pytest.raises(errors.CoordError, match="cannot connect"):
            await c.open()
        seen.append(c.backoff_s())
    assert c.failures == 6
    assert all(0 <= s <= 1.0 for s in seen) and max(seen) > 0


def test_coordd_refuses_tcp_without_tls(daemon_factory, fleet):
    d = daemon_factory(f'listen_tcp = "0.0.0.0:{fleet.port}"\n')
    proc = d.start(wait=False)
    assert proc.wait(10) == 2
    assert "needs TLS" in d.log()
