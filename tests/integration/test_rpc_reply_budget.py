"""Large replies are counted against the outbound budgets before they are built (issue 21,
finding 3): a peer pipelining `get_job` of a job with a large result and reading nothing
makes coordd read only as many rows as its budget holds; the rest wait (unread, unbuilt),
another client is served meanwhile, every reply comes once the peer reads, and the bytes
are all given back after it closes. A real Coordinator behind a Dispatcher on a real Unix
socket, small budgets."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import msgspec

from coordd.net import rpc
from coordd.store import views
from coordd.wire.protocol import Complete

RESULT = 300_000   # bytes of the job's result
UNSENT = 1 << 20   # max_unsent_bytes: about three such replies
PIPELINED = 40
TIMEOUT_S = 10.0


def frame(obj: Any) -> bytes:
    body = msgspec.msgpack.encode(obj)
    return struct.pack(">I", len(body)) + body


async def until(cond, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT_S
    while not cond():
        assert loop.time() < deadline, f"{what} not reached"
        await asyncio.sleep(0.005)


async def read_replies(s: socket.socket, n: int) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    buf, out = b"", []
    while len(out) < n:
        chunk = await asyncio.wait_for(loop.sock_recv(s, 1 << 20), TIMEOUT_S)
        assert chunk, f"closed after {len(out)} replies"
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
            (size,) = struct.unpack(">I", buf[:4])
            out.append(msgspec.msgpack.decode(buf[4:4 + size]))
            buf = buf[4 + size:]
    return out


async def test_a_slow_reader_gets_only_its_budget_of_replies_built(make_bundle, monkeypatch):
    b = await make_bundle(max_result_bytes=1 << 20)
    await b.worker("w")
    job_id = await b.enqueue()
    got = await b.claim("w")
    await b.coord.complete(Complete(job_id=job_id, worker_id="w", token=got.lease.token,
                                    result={"blob": "x" * RESULT}))
    built = []
    real_get_job = views.get_job

    def counting_get_job(*args: Any) -> Any:
        built.append(args[2])
        return real_get_job(*args)

    monkeypatch.setattr(views, "get_job", counting_get_job)
    d = rpc.Dispatcher(lambda method, params: getattr(b.coord, method)(params), 2 << 20,
                       lambda peer: True,
                       limits=rpc.Limits(max_unsent_bytes=UNSENT, max_outbound_bytes=4 << 20))
    path = b.db_path + ".sock"
    server = await asyncio.get_running_loop().create_unix_server(d.accept, path=path)
    loop = asyncio.get_running_loop()
    lazy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        for s in (lazy, other):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.setblocking(False)
            await loop.sock_connect(s, path)
        await loop.sock_sendall(lazy, b"".join(
            frame({"id": i, "method": "get_job", "params": {"job_id": job_id}})
            for i in range(1, PIPELINED + 1)))
        await until(lambda: any(c._write_paused for c in d.connections()),
                    "the lazy peer's replies pile up")
        await asyncio.sleep(0.2)  # time for more rows to be read, were they not held back
        assert 1 <= len(built) <= UNSENT // RESULT + 1, len(built)
        assert d.outbound_bytes + d.reply_reserved <= UNSENT + RESULT + 4096

        await loop.sock_sendall(other, frame({"id": 1, "method": "status", "params": {}})
                                + frame({"id": 2, "method": "get_job",
                                         "params": {"job_id": job_id}}))
        answers = await read_replies(other, 2)  # another peer is not held up
        assert sorted(r["id"] for r in answers) == [1, 2]
        assert all("error" not in r for r in answers), answers

        replies = await read_replies(lazy, PIPELINED)  # it reads: every reply comes, built
        assert sorted(r["id"] for r in replies) == list(range(1, PIPELINED + 1))
        assert [r["error"] for r in replies if "error" in r] == []
        assert all(len(r["result"]["result"]["blob"]) == RESULT for r in replies)
        assert len(built) == PIPELINED + 1
    finally:
        lazy.close()
        other.close()
        await until(lambda: not d.connections(), "connections closed")
        server.close()
        await d.drain(2.0)
    assert d.outbound_bytes == 0 and d.reply_reserved == 0


async def test_a_reply_waiting_for_a_closed_peer_is_dropped(make_bundle):
    b = await make_bundle(max_result_bytes=1 << 20)
    await b.worker("w")
    job_id = await b.enqueue()
    got = await b.claim("w")
    await b.coord.complete(Complete(job_id=job_id, worker_id="w", token=got.lease.token,
                                    result={"blob": "x" * RESULT}))
    d = rpc.Dispatcher(lambda method, params: getattr(b.coord, method)(params), 2 << 20,
                       lambda peer: True,
                       limits=rpc.Limits(max_unsent_bytes=UNSENT, max_outbound_bytes=4 << 20))
    path = b.db_path + ".sock"
    server = await asyncio.get_running_loop().create_unix_server(d.accept, path=path)
    loop = asyncio.get_running_loop()
    lazy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lazy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    lazy.setblocking(False)
    await loop.sock_connect(lazy, path)
    await loop.sock_sendall(lazy, b"".join(
        frame({"id": i, "method": "get_job", "params": {"job_id": job_id}})
        for i in range(1, PIPELINED + 1)))
    await until(lambda: any(c._reply_waiters for c in d.connections()),  # type: ignore[attr-defined]
                "replies wait for the budget")
    lazy.close()
    await until(lambda: not d.connections() and not d._tasks, "closed, requests ended")
    server.close()
    assert d.outbound_bytes == 0 and d.reply_reserved == 0


PAGE_JOBS = 3
PAYLOAD = 200_000  # bytes of each listed job's payload: a page of PAGE_JOBS is ~600 kB


async def test_list_pages_are_sized_against_the_budget_before_they_are_built(make_bundle,
                                                                            monkeypatch):
    """As get_job: a peer pipelining `list_jobs` pages of large jobs and reading nothing
    gets only as many pages built as its budget holds (before, every page was read and
    built, then held or refused); every page comes once it reads."""
    b = await make_bundle(max_payload_bytes=1 << 20)
    for _ in range(PAGE_JOBS):
        await b.enqueue(payload={"blob": "y" * PAYLOAD})
    built = []
    real_list_jobs = views.list_jobs

    def counting_list_jobs(*args: Any, **kw: Any) -> Any:
        built.append(kw.get("limit"))
        return real_list_jobs(*args, **kw)

    monkeypatch.setattr(views, "list_jobs", counting_list_jobs)
    d = rpc.Dispatcher(lambda method, params: getattr(b.coord, method)(params), 2 << 20,
                       lambda peer: True,
                       limits=rpc.Limits(max_unsent_bytes=UNSENT, max_outbound_bytes=8 << 20))
    path = b.db_path + ".sock"
    server = await asyncio.get_running_loop().create_unix_server(d.accept, path=path)
    loop = asyncio.get_running_loop()
    lazy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        lazy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        lazy.setblocking(False)
        await loop.sock_connect(lazy, path)
        await loop.sock_sendall(lazy, b"".join(
            frame({"id": i, "method": "list_jobs", "params": {"limit": PAGE_JOBS}})
            for i in range(1, PIPELINED + 1)))
        await until(lambda: any(c._write_paused for c in d.connections()),
                    "the lazy peer's pages pile up")
        await asyncio.sleep(0.2)  # time for more pages to be built, were they not held back
        page = PAGE_JOBS * PAYLOAD
        assert 1 <= len(built) <= UNSENT // page + 1, len(built)
        assert d.outbound_bytes + d.reply_reserved <= UNSENT + page + 4096

        replies = await read_replies(lazy, PIPELINED)
        assert sorted(r["id"] for r in replies) == list(range(1, PIPELINED + 1))
        assert [r["error"] for r in replies if "error" in r] == []
        assert all(len(r["result"]["jobs"]) == PAGE_JOBS for r in replies)
        assert len(built) == PIPELINED
    finally:
        lazy.close()
        await until(lambda: not d.connections(), "connections closed")
        server.close()
        await d.drain(2.0)
    assert d.outbound_bytes == 0 and d.reply_reserved == 0


def test_a_page_is_sized_as_its_rows(tmp_path):
    """views.page_bytes sizes the very rows list_jobs returns, filters and order alike."""
    import sqlite3

    from coordd import store

    conn = sqlite3.connect(str(tmp_path / "p.db"), isolation_level=None)
    store.migrate(conn)
    for i, (kind, size) in enumerate([("a", 10), ("b", 1000), ("a", 100_000), ("b", 7)]):
        conn.execute("INSERT INTO jobs (job_id, kind, required_role, priority, payload_json,"
                     " status, max_attempts, run_at, queued_at, created_at, updated_at)"
                     " VALUES (?, ?, 'cpu', 2, ?, 'waiting', 3, 0, 0, 0, 0)",
                     (f"j{i}", kind, '"' + "x" * (size - 2) + '"'))
    base = views.LISTED_JOB_BYTES
    flt = {"status": None, "role": None, "priority": None}
    assert views.page_bytes(conn, kind=None, limit=10, after=None, **flt) == 4 * base + 101_017
    assert views.page_bytes(conn, kind="a", limit=10, after=None, **flt) == 2 * base + 100_010
    assert views.page_bytes(conn, kind=None, limit=2, after="j1", **flt) == 2 * base + 100_007
    assert views.page_bytes(conn, kind=None, limit=1, after=None, newest_first=True,
                            **flt) == base + 7
    conn.close()
