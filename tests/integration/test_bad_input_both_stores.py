"""Bad input found by fuzzing every method over a real socket gets the same clear refusal
on both stores: integers past what a store column holds are one `bad_request` (never
`internal`, SQLite's OverflowError, nor PostgreSQL's own refusal text); a result naming an
artifact coordd does not hold is refused."""

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


def test_complete_refuses_an_artifact_reference_the_store_does_not_hold(store_daemon, request):
    """A result naming an artifact coordd does not hold (unknown sha256, or a stored one
    with another size or path) is refused on both stores. Open on SQLite: it stores the
    worker's reference as given (coordd.store.sqlite.leases.complete, SQL_INSERT_ARTIFACT), so `show`
    reports a size and a path (e.g. /etc/passwd) that are not the stored file's."""
    if "sqlite" in request.node.name:  # runs, and must fail until SQLite checks the reference
        request.applymarker(pytest.mark.xfail(
            strict=True, reason="SQLite stores the worker's artifact reference unchecked"))
    with SyncClient(store_daemon.socket) as c:
        c.call("heartbeat", {"worker_id": "w1", "roles": ["gpu"]})
        c.call("enqueue", {"kind": "k", "required_role": "gpu", "priority": 1})
        cl = c.call("claim", {"worker_id": "w1"})
        ref = {"job_id": cl["job"]["job_id"], "worker_id": "w1", "token": cl["lease"]["token"]}
        data = b"abc" * 1000
        sha = hashlib.sha256(data).hexdigest()
        c.call("artifact_put", {**ref, "sha256": sha, "size": len(data), "data": data})
        for art in ({"sha256": sha, "size": 1, "path": "/etc/passwd"},
                    {"sha256": "ab" * 32, "size": 5, "path": "x"}):
            with pytest.raises(errors.CoordError) as exc:
                c.call("complete", {**ref, "artifact": art})
            assert exc.value.code == "bad_request"
        assert c.call("get_job", {"job_id": ref["job_id"]})["status"] == "running"
