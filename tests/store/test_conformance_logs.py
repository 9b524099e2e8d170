"""A job's captured output over both stores (coordd.store.api_logs): the rules of
tests/unit/test_job_logs.py with a pinned `now`, the checks through coordd.service.logs over each
store, the same replies and errors from SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from coordd import errors
from coordd.service.logs import JobLogStore
from coordd.wire.logs import LOG_CHUNK_MAX_BYTES, JobLogsQuery, LogAppend
from coordd.store import logs as log_store
from coordd.store.api import LeaseRef
from tests.store.conftest import T0


async def running(b, now=T0, **kw):
    await b.worker("w1", now=now)
    job = await b.enqueue(now=now, **kw)
    got = await b.claim("w1", now=now, lease_s=30.0)
    assert got.job.job_id == job
    return job, got.lease.token


def append(b, job, token, data: bytes, pos=0, stream="stdout", worker="w1", now=T0 + 1):
    return b.store.log_append(LeaseRef(job, worker, token), stream, pos, data, now=now)


async def read(b, job, after=0, attempt=None, limit_bytes=1 << 20):
    return await b.store.job_logs(job, after, attempt, limit_bytes)


async def test_append_is_fenced_like_a_checkpoint_and_a_resend_is_stored_once(bundle):
    b = bundle
    job, token = await running(b)
    assert await append(b, job, token, b"hello\n") is True
    assert await append(b, job, token, b"hello\n") is False  # a lost reply, resent
    await append(b, job, token, b"oops\n", stream="stderr")
    with pytest.raises(errors.LeaseLost):
        await append(b, job, token + 1, b"x", pos=6)
    with pytest.raises(errors.LeaseLost):
        await append(b, job, token, b"x", pos=6, worker="w2")
    with pytest.raises(errors.NotFound):
        await append(b, "nosuch", token, b"x")
    with pytest.raises(errors.LeaseExpired):
        await append(b, job, token, b"late", pos=6, now=T0 + 30)  # == expires_at
    res = await read(b, job)
    assert [(c.stream, c.pos, c.data, c.attempt, c.token, c.worker_id, c.at)
            for c in res.chunks] == [("stdout", 0, b"hello\n", 1, token, "w1", T0 + 1),
                                     ("stderr", 0, b"oops\n", 1, token, "w1", T0 + 1)]
    assert res.status == "running" and res.next_after == res.chunks[-1].seq and not res.more
    await b.store.complete(LeaseRef(job, "w1", token), '"ok"', now=T0 + 2)
    with pytest.raises(errors.AlreadyCompleted):
        await append(b, job, token, b"after the end", pos=6, now=T0 + 3)
    assert (await read(b, job)).status == "succeeded"


async def test_bad_chunks_and_reads_are_refused_with_stable_codes(bundle):
    b = bundle
    logs = JobLogStore(b.store)
    job, token = await running(b)

    def chunk(**kw):
        return LogAppend(**{"job_id": job, "worker_id": "w1", "token": token,
                            "stream": "stdout", "pos": 0, "data": b"x", **kw})
    for kw, exc in (({"stream": "stdin"}, errors.BadRequest), ({"pos": -1}, errors.BadRequest),
                    ({"pos": (1 << 62) + 1}, errors.BadRequest), ({"data": b""}, errors.BadRequest),
                    ({"data": b"x" * (LOG_CHUNK_MAX_BYTES + 1)}, errors.PayloadTooLarge)):
        with pytest.raises(exc):
            await logs.log_append(chunk(**kw))
    for kw in ({"limit_bytes": 0}, {"limit_bytes": (4 << 20) + 1}, {"after": -1}):
        with pytest.raises(errors.BadRequest):
            await logs.job_logs(JobLogsQuery(job_id=job, **kw))
    with pytest.raises(errors.NotFound, match="job nosuch not found"):
        await logs.job_logs(JobLogsQuery(job_id="nosuch"))
    assert (await logs.job_logs(JobLogsQuery(job_id=job))).chunks == []
    assert await append(b, job, token, b"x", pos=1 << 62, stream="stderr")  # the largest
    assert await append(b, job, token, b"\x00\xff\xfe bytes", pos=9)
    assert [c.data for c in (await read(b, job)).chunks] == [b"x", b"\x00\xff\xfe bytes"]


async def test_reads_page_by_cursor_and_byte_limit(bundle):
    b = bundle
    job, token = await running(b)
    for i in range(5):
        await append(b, job, token, bytes([65 + i]) * 100, pos=100 * i)
    first = await read(b, job, limit_bytes=250)
    assert [c.pos for c in first.chunks] == [0, 100] and first.more
    rest = await read(b, job, after=first.next_after, limit_bytes=250)
    assert [c.pos for c in rest.chunks] == [200, 300] and rest.more
    exact = await read(b, job, after=first.next_after, limit_bytes=200)
    assert [c.pos for c in exact.chunks] == [200, 300] and exact.more
    last = await read(b, job, after=rest.next_after, limit_bytes=10)  # one chunk at least
    assert [c.pos for c in last.chunks] == [400] and not last.more
    tail = await read(b, job, after=last.next_after)
    assert tail.chunks == [] and tail.next_after == last.next_after and not tail.more
    assert not (await read(b, job, after=rest.next_after, limit_bytes=100)).more


async def test_each_stream_keeps_its_tail_and_a_job_its_newest_attempts(bundle, monkeypatch):
    monkeypatch.setattr(log_store, "KEEP_BYTES", 250)
    monkeypatch.setattr(log_store, "KEEP_CHUNKS", 4)
    b = bundle
    job, token = await running(b, max_attempts=20)
    for i in range(4):
        await append(b, job, token, b"o" * 100, pos=100 * i)
    await append(b, job, token, b"e" * 10, stream="stderr")
    kept = (await read(b, job)).chunks
    assert [(c.stream, c.pos) for c in kept] == [  # 400 - 250: what ends after 150
        ("stdout", 100), ("stdout", 200), ("stdout", 300), ("stderr", 0)]
    for i in range(20):
        await append(b, job, token, b"s", pos=1000 + i, stream="stderr")
    assert len([c for c in (await read(b, job)).chunks if c.stream == "stderr"]) == 4
    tokens, now = [token], T0 + 1
    for _ in range(log_store.KEEP_ATTEMPTS + 1):  # each attempt fails and is claimed again
        now += 10
        await b.store.fail(LeaseRef(job, "w1", tokens[-1]), "x", True, lambda n: 0.0, now=now)
        await b.worker("w1", now=now)
        got = await b.claim("w1", now=now)
        tokens.append(got.lease.token)
        await append(b, job, tokens[-1], b"attempt %d" % got.job.attempts, now=now)
    chunks = (await read(b, job)).chunks
    assert sorted({c.token for c in chunks}) == tokens[-log_store.KEEP_ATTEMPTS:]
    assert chunks[-1].attempt == log_store.KEEP_ATTEMPTS + 2
    assert [c.data for c in (await read(b, job, attempt=3)).chunks] == [b"attempt 3"]


async def test_a_retried_job_keeps_its_old_output_and_stores_the_new_attempts(bundle):
    b = bundle
    job, token = await running(b, max_attempts=1)
    await append(b, job, token, b"first run\n")
    await b.store.fail(LeaseRef(job, "w1", token), "x", False, lambda n: 0.0, now=T0 + 2)
    await b.store.retry(job, now=T0 + 3)  # attempts start over at 1
    await b.worker("w1", now=T0 + 3)
    got = await b.claim("w1", now=T0 + 3)
    assert got.job.attempts == 1
    assert await append(b, job, got.lease.token, b"second run\n", now=T0 + 4) is True
    chunks = (await read(b, job)).chunks
    assert [(c.attempt, c.data) for c in chunks] == [(1, b"first run\n"), (1, b"second run\n")]
    assert chunks[0].token != chunks[1].token
    assert (await read(b, job, attempt=1)).chunks == chunks


async def test_a_follower_by_cursor_misses_no_chunk_of_concurrent_appends(bundle):
    """Two streams shipped at once (two connections on PostgreSQL) while a follower reads
    by cursor: it sees every chunk once, in seq order."""
    b = bundle
    job, token = await running(b)
    n = 40
    seen: list[tuple[int, str, int]] = []
    done = asyncio.Event()

    async def ship(stream: str) -> None:
        for i in range(n):
            await append(b, job, token, b"%d" % i, pos=10 * i, stream=stream)

    async def follow() -> None:
        after = 0
        while True:
            finished = done.is_set()
            res = await read(b, job, after=after)
            seen.extend((c.seq, c.stream, c.pos) for c in res.chunks)
            after = res.next_after
            if finished and not res.chunks:
                return
            await asyncio.sleep(0)

    follower = asyncio.create_task(follow())
    await asyncio.gather(ship("stdout"), ship("stderr"))
    done.set()
    await follower
    assert [s for s, _, _ in seen] == sorted({s for s, _, _ in seen})  # in order, once
    assert sorted((st, p) for _, st, p in seen) == sorted(
        (st, 10 * i) for st in ("stdout", "stderr") for i in range(n))
