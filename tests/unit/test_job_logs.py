"""A job's captured output in coordd (coordd.service.logs, coordd.store.logs): fenced like a
checkpoint, a resend stored once, bounded per stream and per job, read by cursor, pruned
with its job. Pinned clock, a real SQLite file."""

from __future__ import annotations

import pytest

from coordd import errors
from coordd.wire.protocol import Fail, JobId
from coordd.wire.logs import LOG_CHUNK_MAX_BYTES, JobLogsQuery, LogAppend
from coordd.store import logs as log_store


async def _running(b, **kw):
    await b.worker("w1")
    job = await b.enqueue(**kw)
    got = await b.claim("w1")
    assert got.job.job_id == job
    return job, got.lease.token


def _append(b, job, token, data: bytes, pos: int = 0, stream: str = "stdout", worker="w1"):
    return b.coord.log_append(LogAppend(job_id=job, worker_id=worker, token=token,
                                        stream=stream, pos=pos, data=data))


async def _read(b, job, after=0, **kw):
    return await b.coord.job_logs(JobLogsQuery(job_id=job, after=after, **kw))


async def test_append_is_fenced_like_a_checkpoint_and_a_resend_is_stored_once(bundle):
    b = bundle
    job, token = await _running(b)
    assert (await _append(b, job, token, b"hello\n")).stored is True
    assert (await _append(b, job, token, b"hello\n")).stored is False  # lost reply, resent
    await _append(b, job, token, b"oops\n", stream="stderr")
    with pytest.raises(errors.LeaseLost):
        await _append(b, job, token + 1, b"x", pos=6)
    with pytest.raises(errors.LeaseLost):
        await _append(b, job, token, b"x", pos=6, worker="w2")
    with pytest.raises(errors.NotFound):
        await _append(b, "nosuch", token, b"x")
    b.clock.advance(31)
    with pytest.raises(errors.LeaseExpired):
        await _append(b, job, token, b"late", pos=6)
    res = await _read(b, job)
    assert [(c.stream, c.pos, c.data, c.attempt, c.worker_id) for c in res.chunks] == [
        ("stdout", 0, b"hello\n", 1, "w1"), ("stderr", 0, b"oops\n", 1, "w1")]
    assert res.status == "running" and res.next_after == res.chunks[-1].seq and not res.more


async def test_bad_chunks_and_reads_are_refused_with_stable_codes(bundle):
    b = bundle
    job, token = await _running(b)
    for kw, exc in (({"stream": "stdin"}, errors.BadRequest), ({"pos": -1}, errors.BadRequest),
                    ({"pos": (1 << 62) + 1}, errors.BadRequest)):
        with pytest.raises(exc):
            await _append(b, job, token, b"x", **kw)
    with pytest.raises(errors.BadRequest):
        await _append(b, job, token, b"")
    with pytest.raises(errors.PayloadTooLarge):
        await _append(b, job, token, b"x" * (LOG_CHUNK_MAX_BYTES + 1))
    with pytest.raises(errors.BadRequest):
        await _read(b, job, limit_bytes=0)
    with pytest.raises(errors.BadRequest):
        await _read(b, job, after=-1)
    with pytest.raises(errors.NotFound):
        await _read(b, "nosuch")
    assert (await _read(b, job)).chunks == []


async def test_reads_page_by_cursor_and_byte_limit(bundle):
    b = bundle
    job, token = await _running(b)
    for i in range(5):
        await _append(b, job, token, bytes([65 + i]) * 100, pos=100 * i)
    first = await _read(b, job, limit_bytes=250)
    assert [c.pos for c in first.chunks] == [0, 100] and first.more
    rest = await _read(b, job, after=first.next_after, limit_bytes=250)
    assert [c.pos for c in rest.chunks] == [200, 300] and rest.more
    last = await _read(b, job, after=rest.next_after, limit_bytes=10)  # one chunk at least
    assert [c.pos for c in last.chunks] == [400] and not last.more
    assert (await _read(b, job, after=last.next_after)).chunks == []


async def test_each_stream_keeps_its_tail_and_a_job_its_newest_attempts(bundle, monkeypatch):
    monkeypatch.setattr(log_store, "KEEP_BYTES", 250)
    monkeypatch.setattr(log_store, "KEEP_CHUNKS", 4)
    b = bundle
    job, token = await _running(b, max_attempts=20)
    for i in range(4):
        await _append(b, job, token, b"o" * 100, pos=100 * i)
    await _append(b, job, token, b"e" * 10, stream="stderr")
    kept = (await _read(b, job)).chunks
    assert [(c.stream, c.pos) for c in kept] == [  # 400 - 250: what ends after 150
        ("stdout", 100), ("stdout", 200), ("stdout", 300), ("stderr", 0)]
    for i in range(20):
        await _append(b, job, token, b"s", pos=1000 + i, stream="stderr")
    assert len([c for c in (await _read(b, job)).chunks if c.stream == "stderr"]) == 4
    tokens = [token]
    for _ in range(log_store.KEEP_ATTEMPTS + 1):  # each attempt fails and is claimed again
        await b.coord.fail(Fail(job_id=job, worker_id="w1", token=tokens[-1], error="x",
                                retryable=True))
        b.clock.advance(700)
        await b.worker("w1")
        got = await b.claim("w1")
        tokens.append(got.lease.token)
        await _append(b, job, tokens[-1], b"attempt %d" % got.job.attempts)
    chunks = (await _read(b, job)).chunks
    assert sorted({c.token for c in chunks}) == tokens[-log_store.KEEP_ATTEMPTS:]
    assert chunks[-1].attempt == log_store.KEEP_ATTEMPTS + 2


async def test_a_retried_job_keeps_its_old_output_and_stores_the_new_attempts(bundle):
    b = bundle
    job, token = await _running(b, max_attempts=1)
    await _append(b, job, token, b"first run\n")
    await b.coord.fail(Fail(job_id=job, worker_id="w1", token=token, error="x", retryable=False))
    await b.coord.retry(JobId(job_id=job))  # attempts start over at 1
    got = await b.claim("w1")
    assert got.job.attempts == 1
    assert (await _append(b, job, got.lease.token, b"second run\n")).stored is True
    chunks = (await _read(b, job)).chunks
    assert [(c.attempt, c.data) for c in chunks] == [(1, b"first run\n"), (1, b"second run\n")]
    assert chunks[0].token != chunks[1].token
    assert (await _read(b, job, attempt=1)).chunks == chunks


async def test_output_is_pruned_with_its_job(make_bundle):
    import sqlite3
    b = await make_bundle(retention_s=100.0)
    job, token = await _running(b)
    await _append(b, job, token, b"bye\n")
    await b.coord.fail(Fail(job_id=job, worker_id="w1", token=token, error="x", retryable=False))
    b.clock.advance(200)
    assert (await b.coord.prune()).pruned == 1
    conn = sqlite3.connect(b.db_path)
    assert conn.execute("SELECT count(*) FROM job_logs").fetchone()[0] == 0
    conn.close()
