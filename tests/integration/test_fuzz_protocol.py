"""Protocol fuzzer (issue 7, item 2): arbitrary and mutated frames against a real coordd.

coordd must never die, never hang a healthy client, and never change stored state on a
refused request.
"""

from __future__ import annotations

import hashlib
import socket
import sqlite3
import struct

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordd.client import SyncClient
from coordd.wire.protocol import PARAMS

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats() | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
    max_leaves=12)
param_names = st.sampled_from(sorted({f for t in PARAMS.values() for f in t.__struct_fields__}))
envelopes = st.fixed_dictionaries({
    "id": st.integers(0, 2**31) | st.text(max_size=3),
    "method": st.sampled_from(sorted(PARAMS)) | st.text(max_size=12),
    "params": st.dictionaries(param_names, json_values, max_size=5) | json_values,
})
frames = st.one_of(
    st.binary(max_size=64).map(lambda b: struct.pack(">I", len(b)) + b),
    envelopes.map(lambda e: msgspec.msgpack.encode(e)).map(
        lambda b: struct.pack(">I", len(b)) + b),
    envelopes.map(msgspec.msgpack.encode).flatmap(
        lambda b: st.integers(0, max(0, len(b) - 1)).map(
            lambda cut: struct.pack(">I", len(b)) + b[:cut])),  # truncated, then hang up
    st.binary(min_size=1, max_size=64),                             # no framing at all
)


def snapshot(db: str) -> str:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        h = hashlib.sha256()
        for table in ("jobs", "leases", "job_events", "workers"):
            for row in conn.execute(f"SELECT * FROM {table} ORDER BY 1"):  # (the key first)
                h.update(repr(row).encode())
        return h.hexdigest()
    finally:
        conn.close()


def exchange(path: str, frame: bytes) -> list[dict]:
    """Send `frame`, half-close, and read every reply until coordd closes (2 s cap)."""
    replies = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2.0)
        s.connect(path)
        s.sendall(frame)
        s.shutdown(socket.SHUT_WR)
        buf = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    while len(buf) >= 4:
        (n,) = struct.unpack(">I", buf[:4])
        replies.append(msgspec.msgpack.decode(buf[4:4 + n]))
        buf = buf[4 + n:]
    return replies


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from tests.integration.conftest import DaemonProc
    d0 = tmp_path_factory.mktemp("fuzz")
    d = DaemonProc(db=str(d0 / "f.db"), socket=str(d0 / "f.sock"), config=None,
                   log_path=str(d0 / "f.log"))
    d.start()
    with SyncClient(d.socket, timeout=5) as c:
        c.enqueue(kind="k", required_role="cpu", priority=1, payload={"seed": True})
    yield d
    assert d.stop() == 0


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(frame=frames)
def test_fuzzed_frames_never_hurt_the_daemon(live, frame):
    before = snapshot(live.db)
    replies = exchange(live.socket, frame)
    assert len(replies) <= 1 or all("id" in r for r in replies)
    if replies and all("error" in r for r in replies):
        assert all(isinstance(r["error"]["code"], str) for r in replies)
        assert snapshot(live.db) == before, "a refused request changed stored state"
    assert live.proc.poll() is None, "coordd died"
    with SyncClient(live.socket, timeout=5) as c:
        assert c.status().jobs["waiting"] >= 1
