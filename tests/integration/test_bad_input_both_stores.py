"""Bad input found by fuzzing every method over a real socket gets the same clear refusal
on both stores: integers past what a store column holds are one `bad_request` (never
`internal`, SQLite's OverflowError, nor PostgreSQL's own refusal text); a result naming an
artifact coordd does not hold is refused; a NUL in an id, an artifact put of another size
than the stored one or of a negative size get one clear `bad_request` too."""

from __future__ import annotations

import hashlib

import pytest

from coordd import errors
from coordd.client import SyncClient

U64 = (1 << 64) - 1
I63 = (1 << 63) - 1


def _refused(c: SyncClient, method: str, params: dict) -> str:
    with pytest.raises(errors.CoordError) as exc:
        c.call(method, params)
    assert exc.value.code == "bad_request", (method, params, exc.value.code, str(exc.value))
    assert "postgresql" not in str(exc.value), str(exc.value)
    return str(exc.value)


def test_out_of_range_integers_are_bad_requests_on_both_stores(store_daemon):
    job = {"kind": "k", "required_role": "gpu", "priority": 1}
    node = {"name": "a", "kind": "k", "required_role": "gpu"}
    with SyncClient(store_daemon.socket) as c:
        c.call("heartbeat", {"worker_id": "w1", "roles": ["gpu"]})
        jid = c.call("enqueue", job)["job_id"]
        for n in (I63, U64):
            assert "max_attempts" in _refused(c, "enqueue", {**job, "max_attempts": n})
            assert "max_attempts" in _refused(
                c, "workflow_submit", {"name": "w", "nodes": [{**node, "max_attempts": n}]})
            assert "priority" in _refused(c, "list_jobs", {"priority": n})
            assert "attempt" in _refused(c, "job_logs", {"job_id": jid, "attempt": n})
        for n in (I63, U64):
            assert "after" in _refused(c, "job_logs", {"job_id": jid, "after": n})
        assert c.call("job_logs", {"job_id": jid, "after": 1 << 62})["chunks"] == []
        cl = c.call("claim", {"worker_id": "w1"})
        ref = {"job_id": cl["job"]["job_id"], "worker_id": "w1", "token": cl["lease"]["token"]}
        data = b"x" * 1000
        sha = hashlib.sha256(data).hexdigest()
        put = c.call("artifact_put", {**ref, "sha256": sha, "size": len(data), "data": data})
        assert put["done"]
        for off in (I63, U64):
            assert "offset" in _refused(c, "artifact_get",
                                        {**ref, "sha256": sha, "offset": off, "limit": 1})
        got = c.call("artifact_get", {**ref, "sha256": sha, "offset": len(data), "limit": 1})
        assert (got["data"], got["size"]) == (b"", len(data))  # past the end: nothing, no error
        assert c.call("status")["jobs"]["running"] == 1  # still serving


def test_complete_refuses_an_artifact_reference_the_store_does_not_hold(store_daemon):
    """A result naming an artifact coordd does not hold (unknown sha256, a stored one with
    another size, a sha256 that is no hex digest) is refused on both stores, the lease
    kept; a held one is recorded with the store's own path, whatever path the worker
    named (SQLite recorded the worker's reference unchecked: `show` reported a size and a
    path, e.g. /etc/passwd, that were not the stored file's)."""
    with SyncClient(store_daemon.socket) as c:
        c.call("heartbeat", {"worker_id": "w1", "roles": ["gpu"]})
        c.call("enqueue", {"kind": "k", "required_role": "gpu", "priority": 1})
        cl = c.call("claim", {"worker_id": "w1"})
        ref = {"job_id": cl["job"]["job_id"], "worker_id": "w1", "token": cl["lease"]["token"]}
        data = b"abc" * 1000
        sha = hashlib.sha256(data).hexdigest()
        put = c.call("artifact_put", {**ref, "sha256": sha, "size": len(data), "data": data})
        for art in ({"sha256": sha, "size": 1, "path": "/etc/passwd"},
                    {"sha256": "ab" * 32, "size": 5, "path": "x"},
                    {"sha256": "../../etc/passwd", "size": 5, "path": "x"}):
            with pytest.raises(errors.CoordError) as exc:
                c.call("complete", {**ref, "artifact": art})
            assert exc.value.code == "bad_request"
            assert "upload it first" in str(exc.value) or "hex digits" in str(exc.value)
        assert c.call("get_job", {"job_id": ref["job_id"]})["status"] == "running"
        done = c.call("complete", {**ref, "result": {"artifact": sha}, "artifact": {
            "sha256": sha, "size": len(data), "path": "/etc/passwd"}})
        assert done["status"] == "succeeded"
        view = c.call("get_job", {"job_id": ref["job_id"]})
        assert view["artifact"] == {"sha256": sha, "size": len(data), "path": put["path"]}


def test_a_nul_in_an_id_is_one_bad_request_on_both_stores(store_daemon):
    """An id or id prefix holding a NUL (or another control character) is refused above
    the stores with one clear message; PostgreSQL answered with its driver's text
    ('invalid byte sequence for encoding "UTF8": 0x00'), SQLite `not_found`."""
    with SyncClient(store_daemon.socket) as c:
        c.call("heartbeat", {"worker_id": "w1", "roles": ["gpu"]})
        jid = c.call("enqueue", {"kind": "k", "required_role": "gpu", "priority": 1})["job_id"]
        cl = c.call("claim", {"worker_id": "w1"})
        bad = jid[:4] + "\x00"
        ref = {"job_id": bad, "worker_id": "w1", "token": cl["lease"]["token"]}
        for method, params in (
                ("get_job", {"job_id": bad, "prefix": True}), ("get_job", {"job_id": bad}),
                ("workflow_get", {"workflow_id": "ab\x00", "prefix": True}),
                ("workflow_get", {"workflow_id": "ab\x00"}),
                ("workflow_cancel", {"workflow_id": "ab\x00", "prefix": True}),
                ("cancel", {"job_id": bad}), ("retry", {"job_id": bad}),
                ("job_logs", {"job_id": bad}), ("renew", ref), ("complete", ref),
                ("complete", {**ref, "job_id": jid, "worker_id": "w\x001"}),
                ("fail", {**ref, "error": "x"}),
                ("log_append", {**ref, "stream": "stdout", "pos": 0, "data": b"x"}),
                ("artifact_get", {**ref, "sha256": "ab" * 32, "offset": 0, "limit": 1})):
            msg = _refused(c, method, params)
            assert "must not contain control" in msg and "U+0000" in msg, (method, msg)
        assert c.call("get_job", {"job_id": jid[:8], "prefix": True})["status"] == "running"


def test_artifact_put_of_another_size_or_a_negative_one_is_the_same_refusal(store_daemon):
    """A put announcing another size than the stored artifact's is one `bad_request` with
    one message on both stores, the stored artifact untouched (SQLite gathered a part and
    refused only once it hashed wrong, or never); a negative size is `bad_request`, not
    `payload_too_large`."""
    with SyncClient(store_daemon.socket) as c:
        c.call("heartbeat", {"worker_id": "w1", "roles": ["gpu"]})
        c.call("enqueue", {"kind": "k", "required_role": "gpu", "priority": 1})
        cl = c.call("claim", {"worker_id": "w1"})
        ref = {"job_id": cl["job"]["job_id"], "worker_id": "w1", "token": cl["lease"]["token"]}
        data = b"x" * 1000
        sha = hashlib.sha256(data).hexdigest()
        assert c.call("artifact_put", {**ref, "sha256": sha, "size": 1000, "data": data})["done"]
        for size, chunk in ((10, b"x" * 10), (2000, b"x" * 10), (2000, b"")):
            msg = _refused(c, "artifact_put", {**ref, "sha256": sha, "size": size,
                                               "data": chunk})
            assert msg == f"artifact {sha[:12]} is stored with 1000 bytes, not {size}", msg
        for sha_asked in (sha, "ab" * 32):
            msg = _refused(c, "artifact_put", {**ref, "sha256": sha_asked, "size": -5,
                                               "data": b""})
            assert msg == "size must be >= 0 bytes, not -5", msg
        got = c.call("artifact_get", {**ref, "sha256": sha, "offset": 0, "limit": 2000})
        assert (got["data"], got["size"]) == (data, 1000)
        again = c.call("artifact_put", {**ref, "sha256": sha, "size": 1000, "data": b""})
        assert again["done"] and again["received"] == 1000
