"""A coordd that is stuck, refuses or answers an error: every page and action gives a
clear status with the error page (504, 503, 403, 502...), never a bare 500."""

from __future__ import annotations

import socket
import struct
import threading

import msgspec
import pytest
from starlette.testclient import TestClient

import coordd_web.app as webapp
from coordd_web.app import Settings, build_app
from tests.integration.test_web import BASE, SAME, same_uid


class StubCoordd:
    """A Unix socket that answers every request with the error `code` (None: accepts and
    never answers, like a SIGSTOPped coordd)."""

    def __init__(self, path: str, code: str | None) -> None:
        self.code = code
        self.srv = socket.socket(socket.AF_UNIX)
        self.srv.bind(path)
        self.srv.listen(16)
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        if self.code is None:
            return
        try:
            while head := conn.recv(4, socket.MSG_WAITALL):
                (n,) = struct.unpack(">I", head)
                req = msgspec.msgpack.decode(conn.recv(n, socket.MSG_WAITALL))
                body = msgspec.msgpack.encode({"id": req["id"], "error": {
                    "code": self.code, "message": f"stub says {self.code}"}})
                conn.sendall(struct.pack(">I", len(body)) + body)
        except OSError:
            return

    def close(self) -> None:
        self.srv.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("code,status", [(None, 504), ("overloaded", 503),
                                         ("unavailable", 503), ("permission_denied", 403),
                                         ("invalid_state", 502), ("internal", 502),
                                         ("something_new", 502)])
def test_pages_and_actions_map_coordd_errors(tmp_path, monkeypatch, code, status):
    monkeypatch.setattr(webapp, "CALL_TIMEOUT_S", 0.3)
    monkeypatch.setattr("coordd_web.actions.CALL_TIMEOUT_S", 0.3)
    stub = StubCoordd(str(tmp_path / "c.sock"), code)
    try:
        app = build_app(Settings(socket=str(tmp_path / "c.sock"), actions=True, token="t",
                                 peer_uid=same_uid))
        with TestClient(app, base_url=BASE, raise_server_exceptions=False) as web:
            for path in ("/", "/jobs", "/jobs/abc", "/workers", "/agents"):
                r = web.get(path)
                assert r.status_code == status, (path, r.status_code, r.text[:200])
                assert "<html" in r.text.lower()  # the error page, not a traceback
            web.cookies.set("coordd_web_token", "t")
            act = web.post("/actions/reap", headers={**SAME, "x-coordd-token": "t"})
            want = 409 if code == "invalid_state" else status
            assert act.status_code == want, act.text
    finally:
        stub.close()


def test_a_page_has_one_deadline_for_all_its_calls(tmp_path, monkeypatch):
    monkeypatch.setattr(webapp, "CALL_TIMEOUT_S", 5.0)
    monkeypatch.setattr(webapp, "PAGE_DEADLINE_S", 0.3)
    stub = StubCoordd(str(tmp_path / "c.sock"), None)
    try:
        app = build_app(Settings(socket=str(tmp_path / "c.sock"), peer_uid=same_uid))
        with TestClient(app, base_url=BASE, raise_server_exceptions=False) as web:
            r = web.get("/jobs")
        assert r.status_code == 504 and "within 0.3s" in r.text
    finally:
        stub.close()
