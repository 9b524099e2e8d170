"""coordd-web answers only its own uid and root: the TCP peer's owner is looked up in
/proc/net/tcp* on every request (coordd_web.peer); another local uid is refused for
pages and actions even with a stolen token, and an unreadable table refuses too."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess

import httpx
import pytest
from starlette.testclient import TestClient

from coordd.client import SyncClient
from coordd_web import peer
from coordd_web.app import Settings, build_app
from coordd_web.security import TOKEN_COOKIE
from tests.integration.webtools import start_web

NOBODY = 65534
BASE = "http://127.0.0.1:8787"


def connected(family: int, host: str):
    """A listener and a client connected to it (real loopback sockets)."""
    lst = socket.socket(family)
    lst.bind((host, 0))
    lst.listen()
    cli = socket.socket(family)
    cli.connect(lst.getsockname()[:2])
    srv, _ = lst.accept()
    return lst, cli, srv


@pytest.fixture(params=["sock_diag", "proc"])
def lookup_path(request, monkeypatch):
    """Each test below runs on both ways of finding the owner: the kernel's sock_diag
    and the /proc/net/tcp* scan (what is left when the kernel does not say)."""
    if request.param == "proc":
        monkeypatch.setattr(peer, "diag_uid", lambda client, server: None)
    return request.param


@pytest.mark.parametrize("family,host", [(socket.AF_INET, "127.0.0.1"),
                                         (socket.AF_INET6, "::1")])
def test_peer_uid_of_a_real_connection(family, host, lookup_path):
    try:
        socks = connected(family, host)
    except OSError as exc:
        pytest.skip(f"no {host} here: {exc}")
    lst, cli, srv = socks
    try:
        client, server = cli.getsockname()[:2], lst.getsockname()[:2]
        assert peer.tcp_peer_uid(client, server) == os.getuid()
        with pytest.raises(peer.PeerUnknown, match="no socket"):  # nothing on that port
            peer.tcp_peer_uid((host, 1), server)
    finally:
        for s in socks:
            s.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv")
def test_peer_uid_of_another_users_socket(lookup_path):
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen()
    port = lst.getsockname()[1]
    code = ("import socket, sys, time; s = socket.create_connection(('127.0.0.1', %d)); "
            "print(s.getsockname()[1], flush=True); sys.stdin.read()" % port)
    proc = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                             "--clear-groups", "/usr/bin/python3", "-c", code],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        their_port = int(proc.stdout.readline())
        srv, _ = lst.accept()
        assert peer.tcp_peer_uid(("127.0.0.1", their_port), ("127.0.0.1", port)) == NOBODY
        srv.close()
    finally:
        proc.stdin.close()
        proc.wait(10)
        proc.stdout.close()
        lst.close()


def test_unreadable_table_refuses(monkeypatch, tmp_path):
    monkeypatch.setattr(peer, "diag_uid", lambda client, server: None)
    lst, cli, srv = connected(socket.AF_INET, "127.0.0.1")
    monkeypatch.setattr(peer, "PROC_TCP", str(tmp_path / "absent"))
    try:
        with pytest.raises(peer.PeerUnknown, match="cannot read"):
            peer.tcp_peer_uid(cli.getsockname(), lst.getsockname())
    finally:
        for s in (lst, cli, srv):
            s.close()


def test_guard_refuses_a_peer_it_cannot_identify_or_another_uid(caplog, tmp_path):
    sock = str(tmp_path / "absent.sock")
    with TestClient(build_app(Settings(socket=sock)), base_url=BASE) as web:
        r = web.get("/jobs")  # TestClient has no TCP peer: the real lookup refuses
        assert r.status_code == 403 and "cannot tell who is connecting" in r.text
        assert r.headers["x-frame-options"] == "DENY"
    with caplog.at_level(logging.WARNING, logger="coordd_web.security"):
        with TestClient(build_app(Settings(socket=sock, peer_uid=lambda c, s: 4242)),
                        base_url=BASE) as web:
            r = web.get("/")
    assert r.status_code == 403 and "uid 4242" in r.text
    assert any(getattr(x, "action", None) == "web_peer_refused" for x in caplog.records)


def as_nobody(*curl: str) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                           "--clear-groups", "curl", "-s", "-w", "\n%{http_code}", *curl],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
@pytest.mark.skipif(not (shutil.which("setpriv") and shutil.which("curl")),
                    reason="needs setpriv and curl")
def test_another_uid_is_refused_pages_and_actions(daemon, tmp_path):
    with SyncClient(daemon.socket) as c:
        job = c.enqueue(kind="k", required_role="cpu", priority=1,
                        payload={"api_key": "SECRET-123"}).job_id
    web = start_web(tmp_path, daemon.socket, "--actions")
    try:
        mine = httpx.get(f"{web.url}/jobs/{job}", timeout=10)  # this uid (root): served
        assert mine.status_code == 200 and "SECRET-123" in mine.text
        page = as_nobody(f"{web.url}/jobs/{job}")
        body, code = page.stdout.rsplit("\n", 1)
        assert code == "403" and "SECRET-123" not in body and f"uid {NOBODY}" in body
        assert as_nobody(f"{web.url}/events").stdout.endswith("403")
        # a token stolen from the cookie (cookies are per host, not per port) is no use
        act = as_nobody("-X", "POST", "-H", "Sec-Fetch-Site: same-origin",
                        "-H", f"X-Coordd-Token: {web.token}",
                        "-b", f"{TOKEN_COOKIE}={web.token}", f"{web.url}/actions/cancel/{job}")
        assert act.stdout.endswith("403"), act.stdout
        with SyncClient(daemon.socket) as c:
            assert c.get_job(job).status == "waiting"
    finally:
        web.stop()
    assert f"uid {NOBODY} may not use this coordd-web" in web.log_path.read_text()
