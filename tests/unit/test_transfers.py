"""Files over the connection (issue 18, coordd.service.transfers): chunked, resumable from where
coordd's partial copy ends, hashed before the file enters the store, fenced by the lease."""

from __future__ import annotations

import hashlib
import os

import pytest

from coordd import errors
from coordd.wire.transfers import ArtifactGet, ArtifactPut


async def _held(b):
    await b.worker("wa")
    await b.enqueue()
    got = await b.claim("wa", lease_s=30)
    return got.job.job_id, got.lease.token


async def test_upload_resumes_verifies_and_reads_back(bundle):
    b = bundle
    job, token = await _held(b)
    data = os.urandom(3000)
    sha = hashlib.sha256(data).hexdigest()

    def put(offset: int, chunk: bytes, sha256: str = sha):
        return b.coord.artifact_put(ArtifactPut(job_id=job, worker_id="wa", token=token,
                                                sha256=sha256, size=len(data), offset=offset,
                                                data=chunk))
    r = await put(0, data[:1000])
    assert (r.received, r.done) == (1000, False)
    r = await put(0, data[:1000])  # a resend after a lost reply: coordd says where it stands
    assert (r.received, r.done) == (1000, False)
    r = await put(1000, data[1000:])
    assert r.done and r.received == 3000
    with open(r.path, "rb") as fh:
        assert fh.read() == data
    assert os.path.dirname(os.path.dirname(r.path)) == b.coord.artifact_dir
    again = await put(0, b"")  # already stored: done at once
    assert again.done and again.path == r.path
    got = await b.coord.artifact_get(ArtifactGet(job_id=job, worker_id="wa", token=token,
                                                 sha256=sha, offset=1000, limit=500))
    assert got.data == data[1000:1500] and got.size == 3000


async def test_upload_that_does_not_hash_as_announced_is_refused(bundle):
    b = bundle
    job, token = await _held(b)
    wrong = "0" * 64
    with pytest.raises(errors.BadRequest, match="hashes to"):
        await b.coord.artifact_put(ArtifactPut(job_id=job, worker_id="wa", token=token,
                                               sha256=wrong, size=4, data=b"abcd"))
    assert not os.path.exists(os.path.join(b.coord.artifact_dir, wrong[:2], wrong))
    assert not os.listdir(os.path.join(b.coord.artifact_dir, ".uploads"))


async def test_transfers_need_the_current_lease(bundle):
    b = bundle
    job, token = await _held(b)
    with pytest.raises(errors.LeaseLost):
        await b.coord.artifact_put(ArtifactPut(job_id=job, worker_id="wa", token=token + 1,
                                               sha256="a" * 64, size=1, data=b"x"))
    b.clock.advance(31)  # expired, not yet reaped
    with pytest.raises(errors.LeaseExpired):
        await b.coord.artifact_get(ArtifactGet(job_id=job, worker_id="wa", token=token,
                                               sha256="a" * 64))
    with pytest.raises(errors.BadRequest, match="64 lowercase hex"):
        await b.coord.artifact_get(ArtifactGet(job_id=job, worker_id="wa", token=token,
                                               sha256="../../etc/passwd"))


async def test_puts_of_one_sha256_never_overlap_when_a_third_arrives():
    """Three puts of one sha256: the first's release must not drop the turn lock while the
    second still waits on it, or a third takes a fresh lock and overlaps the second (on
    SQLite two threads wrote one .part file: `internal` FileNotFoundError)."""
    import asyncio
    from coordd.config import Config
    from coordd.wire.transfers import ArtifactPutResult
    from coordd.service.transfers import Transfers

    class Store:
        inside = most = 0

        async def artifact_put(self, ref, sha256, size, offset, data):
            Store.inside += 1
            Store.most = max(Store.most, Store.inside)
            await asyncio.sleep(0.01)
            Store.inside -= 1
            return ArtifactPutResult(received=0)

    t = Transfers(Store(), Config())

    def put():
        return t.artifact_put(ArtifactPut(job_id="j", worker_id="w", token=1, sha256="a" * 64,
                                          size=1, data=b""))
    first, second = asyncio.ensure_future(put()), asyncio.ensure_future(put())
    await first  # `second` was woken but has not run yet
    await asyncio.gather(put(), second)
    assert Store.most == 1
    assert not t._locks  # nothing left behind once all are done
