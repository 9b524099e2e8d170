"""Artifacts over both stores (coordd.store.api_artifacts): chunked, resumable,
content-addressed uploads, ranged reads, the fence, the sweep of unreferenced artifacts;
the same answers and errors from SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import json

import pytest

from coordd import errors
from coordd.store.api import LeaseRef
from tests.store.conftest import T0


async def running(b, worker="w1", now=T0):
    await b.worker(worker, now=now)
    job = await b.enqueue(now=now)
    got = await b.claim(worker, now=now, lease_s=30.0)
    assert got.job.job_id == job
    return LeaseRef(job, worker, got.lease.token)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def put_all(b, ref, data: bytes, chunk: int = 4, now=T0 + 1):
    res = None
    for pos in range(0, max(len(data), 1), chunk):
        res = await b.store.artifact_put(ref, sha(data), len(data), pos,
                                         data[pos:pos + chunk], now=now)
    return res


async def test_a_chunked_upload_resumes_where_the_store_stands_and_reads_back(bundle):
    b = bundle
    ref = await running(b)
    data = b"0123456789abcdefXYZ"
    s = sha(data)
    put = b.store.artifact_put
    assert (await put(ref, s, len(data), 0, data[:8], now=T0 + 1)).received == 8
    assert not (await put(ref, s, len(data), 0, data[:8], now=T0 + 1)).done  # a resend
    got = await put(ref, s, len(data), 12, data[12:], now=T0 + 1)  # a gap: nothing stored
    assert (got.received, got.done) == (8, False)
    with pytest.raises(errors.NotFound):  # not stored until whole
        await b.store.artifact_get(ref, s, 0, 100, now=T0 + 1)
    done = await put(ref, s, len(data), 8, data[8:], now=T0 + 1)
    assert done.done and done.received == len(data) and s in done.path
    again = await put(ref, s, len(data), 0, b"", now=T0 + 2)  # stored: done at once
    assert (again.done, again.received, again.path) == (True, len(data), done.path)
    get = b.store.artifact_get
    whole = await get(ref, s, 0, 1 << 20, now=T0 + 2)
    assert (whole.data, whole.size) == (data, len(data))
    assert (await get(ref, s, 5, 7, now=T0 + 2)).data == data[5:12]
    assert (await get(ref, s, 17, 100, now=T0 + 2)).data == data[17:]
    assert (await get(ref, s, 100, 10, now=T0 + 2)).data == b""
    with pytest.raises(errors.NotFound, match="is not in coordd's store"):
        await get(ref, sha(b"other"), 0, 10, now=T0 + 2)


async def test_puts_and_gets_are_fenced_like_a_checkpoint(bundle):
    b = bundle
    ref = await running(b)
    data = b"fenced"
    await put_all(b, ref, data, chunk=100)
    bad = [(LeaseRef(ref.job_id, ref.worker_id, ref.token + 1), errors.LeaseLost, T0 + 1),
           (LeaseRef(ref.job_id, "w2", ref.token), errors.LeaseLost, T0 + 1),
           (LeaseRef("nosuch", ref.worker_id, ref.token), errors.NotFound, T0 + 1),
           (ref, errors.LeaseExpired, T0 + 30)]  # == expires_at
    for r, exc, now in bad:
        with pytest.raises(exc):
            await b.store.artifact_put(r, sha(b"x"), 1, 0, b"x", now=now)
        with pytest.raises(exc):
            await b.store.artifact_get(r, sha(data), 0, 10, now=now)
    await b.store.complete(ref, '"ok"', now=T0 + 2)
    with pytest.raises(errors.AlreadyCompleted):
        await b.store.artifact_get(ref, sha(data), 0, 10, now=T0 + 3)


async def test_bytes_that_do_not_hash_as_announced_are_refused_and_dropped(bundle):
    b = bundle
    ref = await running(b)
    data, lie = b"the real bytes", sha(b"something else")
    assert (await b.store.artifact_put(ref, lie, len(data), 0, data[:4], now=T0)).received == 4
    with pytest.raises(errors.BadRequest, match="hashes to"):
        await b.store.artifact_put(ref, lie, len(data), 4, data[4:], now=T0)
    again = await b.store.artifact_put(ref, lie, len(data), 4, data[4:], now=T0)
    assert (again.received, again.done) == (0, False)  # starts over
    with pytest.raises(errors.NotFound):
        await b.store.artifact_get(ref, lie, 0, 10, now=T0)
    # a part gathered for a larger size starts over when a smaller one is announced
    other = b"0123456789"
    part = await b.store.artifact_put(ref, sha(other[:3]), 10, 0, other[:5], now=T0)
    assert part.received == 5
    res = await b.store.artifact_put(ref, sha(other[:3]), 3, 0, other[:3], now=T0)
    assert res.done and res.received == 3


async def test_an_empty_file_and_the_same_bytes_from_two_jobs(bundle):
    b = bundle
    ref1 = await running(b, "w1")
    ref2 = await running(b, "w2")
    empty = await b.store.artifact_put(ref1, sha(b""), 0, 0, b"", now=T0)
    assert empty.done and empty.received == 0
    assert (await b.store.artifact_get(ref1, sha(b""), 0, 10, now=T0)).size == 0
    data = b"shared content" * 3
    first = await put_all(b, ref1, data, chunk=10)
    second = await b.store.artifact_put(ref2, sha(data), len(data), 0, data[:10], now=T0 + 1)
    assert second.done and second.path == first.path  # stored once
    assert (await b.store.artifact_get(ref2, sha(data), 0, 100, now=T0 + 1)).data == data
    assert await b.store.artifact_bytes() == len(data)


async def test_the_sweep_drops_old_unreferenced_artifacts_only(bundle):
    b = bundle
    ref = await running(b)
    old, kept, fresh = b"old and unreferenced", b"named by a checkpoint", b"put late"
    await put_all(b, ref, old, chunk=100, now=T0 + 1)
    done = await put_all(b, ref, kept, chunk=100, now=T0 + 1)
    previous = await put_all(b, ref, b"an older checkpoint", chunk=100, now=T0 + 1)
    await put_all(b, ref, fresh, chunk=100, now=T0 + 20)
    record = {"sha256": sha(kept), "path": done.path, "size": len(kept),
              "previous": [{"sha256": sha(b"an older checkpoint"), "path": previous.path}]}
    await b.store.checkpoint(ref, json.dumps(record), now=T0 + 2)
    refs = await b.store.artifact_refs()
    assert refs == {sha(kept): done.path, sha(b"an older checkpoint"): previous.path}
    assert await b.store.artifact_sweep(T0 + 10, now=T0 + 21) == 1
    for data, there in ((old, False), (kept, True), (fresh, True)):
        if there:
            assert (await b.store.artifact_get(ref, sha(data), 0, 100, now=T0 + 21)).data == data
        else:
            with pytest.raises(errors.NotFound):
                await b.store.artifact_get(ref, sha(data), 0, 100, now=T0 + 21)
    await put_all(b, ref, fresh, chunk=100, now=T0 + 25)  # a put again makes it fresh
    assert await b.store.artifact_sweep(T0 + 22, now=T0 + 26) == 0
    assert await b.store.artifact_sweep(T0 + 30, now=T0 + 29) == 1
    assert await b.store.artifact_bytes() == len(kept) + len(b"an older checkpoint")


async def test_a_second_coordd_on_the_database_serves_what_the_first_stored(bundle, request):
    """PostgreSQL: the bytes are in the database (a standby on another host reads them)."""
    b = bundle
    if b.kind != "postgres":
        pytest.skip("SQLite: one coordd per file; its artifacts are files beside it")
    from coordd.store.postgres import PostgresStore
    ref = await running(b)
    data = bytes(range(256)) * 4096  # 1 MiB, in 256 KiB chunks
    await put_all(b, ref, data, chunk=256 << 10)
    standby = PostgresStore(request.getfixturevalue("pg_dsn"))
    await standby.start()
    try:
        got = await standby.artifact_get(ref, sha(data), (1 << 20) - 300_000, 1 << 20,
                                         now=T0 + 2)
        assert got.data == data[-300_000:] and got.size == len(data)
    finally:
        await standby.close()


async def test_complete_names_an_uploaded_artifact_on_either_store(bundle):
    """The worker's path for a result over its inline limit: artifact_put, then complete
    naming it; the job's view carries the artifact (issue 28: kept on PostgreSQL too)."""
    from coordd.wire.protocol import ArtifactRef
    b = bundle
    ref = await running(b)
    data = b'{"big": "' + b"x" * 100 + b'"}'
    done = await put_all(b, ref, data, chunk=64)
    art = ArtifactRef(sha256=sha(data), size=len(data), path=done.path)
    res = await b.store.complete(ref, json.dumps({"artifact": art.sha256}), artifact=art,
                                 now=T0 + 2)
    assert res.status == "succeeded"
    view = await b.store.get_job(ref.job_id, now=T0 + 2)
    assert view.artifact is not None
    assert (view.artifact.sha256, view.artifact.size, view.artifact.path) == \
        (art.sha256, len(data), done.path)
    assert (await b.store.artifact_refs()) == {art.sha256: done.path}


async def test_a_store_says_whether_it_holds_an_artifact_and_where(bundle):
    """`artifact_held`: None until an upload is whole (the coordinator refuses a result
    naming it), then the store's own size and path, the path `artifact_put` answered."""
    b = bundle
    ref = await running(b)
    data = b"held bytes" * 10
    assert await b.store.artifact_held(sha(data)) is None
    await b.store.artifact_put(ref, sha(data), len(data), 0, data[:7], now=T0 + 1)
    assert await b.store.artifact_held(sha(data)) is None  # still uploading
    done = await b.store.artifact_put(ref, sha(data), len(data), 7, data[7:], now=T0 + 1)
    assert done.done
    held = await b.store.artifact_held(sha(data))
    assert (held.sha256, held.size, held.path) == (sha(data), len(data), done.path)


async def test_a_put_of_another_size_than_the_stored_one_is_refused_alike(bundle):
    """Both stores refuse it with one message, storing nothing and keeping the stored
    artifact (SQLite gathered a part and refused only once it hashed wrong)."""
    from coordd.store.api_artifacts import stored_with_other_size
    b = bundle
    ref = await running(b)
    data = b"sized" * 20
    done = await put_all(b, ref, data, chunk=len(data))
    for size in (10, 1000):
        with pytest.raises(errors.BadRequest) as exc:
            await b.store.artifact_put(ref, sha(data), size, 0, b"x" * 10, now=T0 + 2)
        assert str(exc.value) == stored_with_other_size(sha(data), len(data), size)
    assert (await b.store.artifact_held(sha(data))).size == len(data)
    got = await b.store.artifact_get(ref, sha(data), 0, 1 << 20, now=T0 + 2)
    assert (got.data, got.size) == (data, len(data))
    assert (await b.store.artifact_put(ref, sha(data), len(data), 0, b"",
                                       now=T0 + 2)).path == done.path


async def test_postgres_refuses_a_complete_naming_an_artifact_it_does_not_hold(bundle):
    """The coordinator refuses such a result on both stores (coordd.service.transfers.held);
    PostgreSQL's complete checks again in its transaction, for an artifact swept between
    that check and it: refused, the lease kept (the worker uploads and resends)."""
    from coordd.wire.protocol import ArtifactRef
    b = bundle
    if b.store.name != "PostgreSQL":
        pytest.skip("SQLite records the path a worker on its host wrote into its folder")
    ref = await running(b)
    art = ArtifactRef(sha256=sha(b"elsewhere"), size=9, path="/tmp/elsewhere")
    with pytest.raises(errors.BadRequest, match="upload it first"):
        await b.store.complete(ref, "{}", artifact=art, now=T0 + 2)
    view = await b.store.get_job(ref.job_id, now=T0 + 2)
    assert view.status == "running" and view.artifact is None
