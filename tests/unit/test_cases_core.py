"""The failure cases of shared/cases/CASES.md that coordd's core must hold, one test per
case id, on a pinned clock (FakeClock; no sleeps make time pass): the lease and failure
cases here (B01-B14); queueing, clocks and storage in test_cases_queue.py."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from coordd import errors
from coordd.service import coordinator as coordinator_mod
from coordd.store.sqlite import leases
from coordd.wire.protocol import Complete, Fail, JobId, Renew

KiB = 1024
MiB = 1024 * KiB


async def _complete(b, job_id: str, worker: str, token: int, result):
    return await b.coord.complete(Complete(job_id=job_id, worker_id=worker, token=token,
                                           result=result))


async def _renew(b, job_id: str, worker: str, token: int, lease_s: float = 30.0):
    return await b.coord.renew(Renew(job_id=job_id, worker_id=worker, token=token,
                                     lease_s=lease_s))


async def _fail(b, job_id: str, worker: str, token: int, error: str, **kw):
    return await b.coord.fail(Fail(job_id=job_id, worker_id=worker, token=token, error=error,
                                   **kw))


async def _job(b, job_id: str):
    return await b.coord.get_job(JobId(job_id=job_id))


def _db(b) -> sqlite3.Connection:
    return sqlite3.connect(b.db_path)


# ---------------------------------------------------------------- B01


async def test_b01_claim_runs_inside_one_begin_immediate(bundle):
    """The candidate SELECT, the status UPDATE and the lease INSERT run inside one BEGIN
    IMMEDIATE on a connection in autocommit mode (isolation_level=None), so Python's
    sqlite3 never opens or commits an implicit transaction in between."""
    db = bundle.coord.store.writer._conn
    assert db.isolation_level is None
    await bundle.worker("w1")
    job = await bundle.enqueue()
    stmts: list[str] = []
    db.set_trace_callback(stmts.append)
    try:
        got = await bundle.claim("w1")
    finally:
        db.set_trace_callback(None)
    assert got.job.job_id == job
    heads = [" ".join(s.split()[:2]).upper() for s in stmts]
    assert heads.count("BEGIN IMMEDIATE") == 1 and heads.count("COMMIT") == 1
    begin, commit = heads.index("BEGIN IMMEDIATE"), heads.index("COMMIT")
    inside = stmts[begin + 1:commit]
    assert any("INDEXED BY jobs_claim" in s for s in inside)
    assert any(s.startswith("UPDATE jobs SET status = 'running'") for s in inside)
    assert any(s.startswith("INSERT INTO leases") for s in inside)
    assert not any(h.startswith(("BEGIN", "COMMIT", "END", "ROLLBACK"))
                   for h in heads[:begin] + heads[begin + 1:commit])


# ---------------------------------------------------------------- B04


async def test_b04_late_complete_rejected(bundle):
    await bundle.worker("w1")
    job = await bundle.enqueue(priority=3)
    c1 = await bundle.claim("w1", lease_s=30)                      # t=0
    bundle.clock.advance(31)                                        # W1 frozen
    assert (await bundle.coord.reap()).reaped == 1
    bundle.clock.advance(1)                                         # t=32
    await bundle.worker("w2")
    c2 = await bundle.claim("w2", lease_s=30)
    assert c2.job.job_id == job and c2.lease.token > c1.lease.token
    bundle.clock.advance(3)                                         # t=35: W1 resumes
    with pytest.raises(errors.LeaseLost):
        await _renew(bundle, job, "w1", c1.lease.token)
    with pytest.raises((errors.LeaseLost, errors.LeaseExpired)):
        await _complete(bundle, job, "w1", c1.lease.token, {"r": "r1"})
    bundle.clock.advance(5)                                         # t=40
    await _complete(bundle, job, "w2", c2.lease.token, {"r": "r2"})
    view = await _job(bundle, job)
    assert view.status == "succeeded" and view.result == {"r": "r2"} and view.attempts == 2
    with pytest.raises(errors.LeaseLost):  # a superseded lease never hears "already_completed"
        await _complete(bundle, job, "w1", c1.lease.token, {"r": "r1"})
    with _db(bundle) as conn:
        hits = conn.execute("SELECT (SELECT count(*) FROM jobs WHERE result_json LIKE '%r1%') "
                            "+ (SELECT count(*) FROM job_events WHERE reason LIKE '%r1%')")
        assert hits.fetchone()[0] == 0


# ---------------------------------------------------------------- B05


async def _b05(bundle, *, renew_fault_at: float | None = None,
               stop_at: float | None = None) -> tuple[str, float | None]:
    """A 100 s job on a 30 s lease renewed every 10 s, reaper every 5 s. Returns the job
    and the time it was reaped (None if never)."""
    await bundle.worker("w1")
    job = await bundle.enqueue()
    t0 = bundle.clock.wall()
    c = await bundle.claim("w1", lease_s=30)
    token, reaped_at = c.lease.token, None
    for step in range(1, 21):  # t = 5 .. 100
        bundle.clock.advance(5)
        t = step * 5
        stopped = stop_at is not None and t > stop_at
        if not stopped and t % 10 == 0 and t < 100:
            if t == renew_fault_at:
                with pytest.raises(errors.Overloaded):
                    await _renew(bundle, job, "w1", token)
                bundle.clock.advance(2)           # the supervisor retries before expiry
                await _renew(bundle, job, "w1", token)
            else:
                await _renew(bundle, job, "w1", token)
        if (await bundle.coord.reap()).reaped:
            reaped_at = bundle.clock.wall() - t0
            break
        if t == 100 and not stopped:
            await _complete(bundle, job, "w1", token, {"done": True})
    return job, reaped_at


async def test_b05_renewed_long_job_never_reaped(bundle):
    job, reaped_at = await _b05(bundle)
    view = await _job(bundle, job)
    assert reaped_at is None
    assert view.status == "succeeded" and view.attempts == 1


async def test_b05_transient_renew_failure_retried_keeps_lease(bundle, monkeypatch):
    real, faults = leases.renew, []
    t_fault = bundle.clock.wall() + 20

    def flaky(conn, now, *args):
        if now == t_fault and not faults:
            faults.append(now)
            raise errors.Overloaded("injected transient error")
        return real(conn, now, *args)
    monkeypatch.setattr(leases, "renew", flaky)
    job, reaped_at = await _b05(bundle, renew_fault_at=20)
    assert len(faults) == 1
    view = await _job(bundle, job)
    assert reaped_at is None
    assert view.status == "succeeded" and view.attempts == 1
    assert [e.to_status for e in view.events] == ["waiting", "running", "succeeded"]


async def test_b05_stopped_holder_requeued_only_after_last_renewal_expired(bundle):
    job, reaped_at = await _b05(bundle, stop_at=40)  # last renewal at t=40
    assert reaped_at == 70  # 40 + 30: not a moment earlier, and at the first reap after
    view = await _job(bundle, job)
    assert view.status == "waiting" and view.attempts == 1


# ---------------------------------------------------------------- B08


async def test_b08_lost_complete_reply_resend_gets_already_completed(bundle):
    await bundle.worker("w1")
    job = await bundle.enqueue()
    c = await bundle.claim("w1", lease_s=30)
    bundle.clock.advance(10)
    lost = asyncio.create_task(_complete(bundle, job, "w1", c.lease.token, {"r": "r1"}))
    await asyncio.sleep(0)  # the request is queued to the writer ...
    lost.cancel()           # ... and the caller goes away before the reply
    bundle.clock.advance(1)                                           # t=11: resend
    with pytest.raises(errors.AlreadyCompleted):
        await _complete(bundle, job, "w1", c.lease.token, {"r": "r1"})
    bundle.clock.advance(1)                                           # t=12
    with pytest.raises(errors.AlreadyCompleted):
        await _complete(bundle, job, "w1", c.lease.token, {"r": "r2"})
    await bundle.worker("w2")
    with pytest.raises(errors.LeaseLost):
        await _complete(bundle, job, "w2", c.lease.token + 1, {"r": "r2"})
    bundle.clock.advance(1)                                           # t=13
    with pytest.raises(errors.AlreadyCompleted):
        await _fail(bundle, job, "w1", c.lease.token, "transient", retryable=True)
    view = await _job(bundle, job)
    assert view.status == "succeeded" and view.result == {"r": "r1"} and view.attempts == 1
    assert errors.AlreadyCompleted.code not in (errors.LeaseExpired.code, errors.LeaseLost.code)


# ---------------------------------------------------------------- B11


async def test_b11_lease_expiries_count_against_max_attempts(bundle):
    job = await bundle.enqueue(max_attempts=3)
    for attempt in (1, 2, 3):
        await bundle.worker("w1")
        c = await bundle.claim("w1", lease_s=30)
        assert c.job.job_id == job and c.job.attempts == attempt  # counted at claim
        bundle.clock.advance(2)           # the supervisor is killed -9 (OOM)
        bundle.clock.advance(29)          # the lease runs out; the reaper runs
        assert (await bundle.coord.reap()).reaped == 1
    view = await _job(bundle, job)
    assert view.status == "failed" and view.attempts == 3
    assert view.last_error == "attempts exhausted (last: lease_expired)"
    for _ in range(3):
        bundle.clock.advance(3600)
        await bundle.worker("w1")
        assert (await bundle.claim("w1")).job is None
    assert sum(e.to_status == "running" for e in view.events) == 3


# ---------------------------------------------------------------- B13


async def test_b13_permanent_fails_at_once_transient_backs_off_and_is_bounded(make_bundle):
    b = await make_bundle(backoff_jitter=0.0)
    base = b.coord.config.backoff_base_s
    await b.worker("w1")
    a = await b.enqueue(max_attempts=5)
    c = await b.claim("w1")
    res = await _fail(b, a, "w1", c.lease.token, "404 Not Found (signed URL expired)",
                      retryable=False)
    view = await _job(b, a)
    assert res.status == "failed" and res.run_at is None
    assert view.attempts == 1 and view.last_error.startswith("permanent: 404")

    job_b = await b.enqueue(max_attempts=5)
    for attempt in range(1, 6):
        await b.worker("w1")
        c = await b.claim("w1")
        assert c.job.job_id == job_b and c.job.attempts == attempt
        now = b.clock.wall()
        res = await _fail(b, job_b, "w1", c.lease.token, "503 upstream", retryable=True)
        if attempt < 5:
            assert res.status == "waiting"
            assert res.run_at >= now + base * 2 ** (attempt - 1)
            assert (await b.claim("w1")).job is None  # not before its backoff
            b.clock.set(res.run_at)
    assert res.status == "failed"
    assert (await _job(b, job_b)).last_error == "attempts exhausted (last: 503 upstream)"

    job_c = await b.enqueue()  # the default budget (max_attempts_default)
    statuses = []
    for _ in range(10):
        await b.worker("w1")
        c = await b.claim("w1")
        if c.job is None:
            break
        res = await b.coord.fail(Fail(job_id=job_c, worker_id="w1", token=c.lease.token,
                                      error="something odd"))  # unclassified: retryable
        statuses.append(res.status)
        if res.run_at:
            b.clock.set(res.run_at)
    assert statuses == ["waiting"] * (b.coord.config.max_attempts_default - 1) + ["failed"]


# ---------------------------------------------------------------- B14


async def test_b14_huge_error_truncated_transition_atomic(bundle):
    await bundle.worker("w1")
    job = await bundle.enqueue(max_attempts=3)
    huge = "E" * (50 * MiB)
    claims, t_end = 0, bundle.clock.wall() + 300
    while bundle.clock.wall() < t_end:
        await bundle.worker("w1")
        c = await bundle.claim("w1")
        if c.job is not None:
            claims += 1
            res = await _fail(bundle, job, "w1", c.lease.token, huge, retryable=True)
            view = await _job(bundle, job)
            assert view.attempts == claims and view.lease is None
            assert len(view.last_error) < bundle.coord.config.max_error_chars + 100
            if res.status == "waiting":
                bundle.clock.set(res.run_at - 0.5)
                await bundle.worker("w1")
                assert (await bundle.claim("w1")).job is None  # not before its backoff
        bundle.clock.advance(1)
    assert claims == 3
    assert (await _job(bundle, job)).status == "failed"


async def test_b14_unstorable_error_text_is_sanitized(bundle):
    await bundle.worker("w1")
    job = await bundle.enqueue(max_attempts=3)
    c = await bundle.claim("w1")
    res = await _fail(bundle, job, "w1", c.lease.token, "bad \ud800 bytes \x00 here")
    assert res.status == "waiting"
    view = await _job(bundle, job)
    assert "\\ud800" in view.last_error and view.attempts == 1


async def test_b14_failure_path_error_leaves_lease_and_job_follows_expiry(bundle, monkeypatch):
    await bundle.worker("w1")
    job = await bundle.enqueue(max_attempts=3)
    c = await bundle.claim("w1", lease_s=30)

    def broken(*a, **kw):
        raise RuntimeError("the failure path itself breaks")
    monkeypatch.setattr(coordinator_mod, "backoff_delay", broken)  # the Coordinator's backoff
    with pytest.raises(errors.CoordError) as exc:
        await _fail(bundle, job, "w1", c.lease.token, "transient")
    assert exc.value.code == "internal"
    view = await _job(bundle, job)  # all or nothing: the lease is as it was
    assert view.status == "running" and view.lease.token == c.lease.token
    assert view.attempts == 1 and view.last_error is None
    bundle.clock.advance(30)
    assert (await bundle.coord.reap()).reaped == 1
    assert (await _job(bundle, job)).attempts == 1
    monkeypatch.undo()
    assert leases.backoff_delay(5000, 5.0, 600.0, 0.25, 0.5) == 600.0 * 1.125  # no overflow
