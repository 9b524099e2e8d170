"""The core rules of DESIGN.md and issue 2, on a pinned clock (no sleeps)."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from coordd import errors
from coordd.wire.protocol import Checkpoint, Complete, Fail, JobId, ListJobs, Renew
from tests.conftest import T0


async def test_p0_claimed_before_older_p3(bundle):
    await bundle.worker("w1")
    old_p3 = await bundle.enqueue(priority=3, kind="idle_learning")
    bundle.clock.advance(5)
    p0 = await bundle.enqueue(priority=0, kind="user_request")
    first = await bundle.claim("w1")
    second = await bundle.claim("w1")
    assert first.job.job_id == p0
    assert second.job.job_id == old_p3


async def test_memory_gate_refuses_at_90_and_allows_at_80(bundle):
    job = await bundle.enqueue(priority=1)
    await bundle.worker("w1", memory_used_pct=90.0)
    refused = await bundle.claim("w1")
    assert refused.job is None
    assert refused.reasons == ["memory_high"]
    await bundle.worker("w1", memory_used_pct=80.0)
    got = await bundle.claim("w1")
    assert got.job.job_id == job


async def test_reference_timeline(bundle):
    """45 s lease at t=102 expires at 147; complete at 148 refused before any reap;
    reap at 149 requeues; another worker claims at 150 with a larger token."""
    await bundle.worker("w1")
    job = await bundle.enqueue()
    bundle.clock.set(102)
    c1 = await bundle.claim("w1", lease_s=45)
    assert c1.lease.expires_at == 147.0
    bundle.clock.set(148)
    with pytest.raises(errors.LeaseExpired):
        await bundle.coord.complete(Complete(job_id=job, worker_id="w1",
                                             token=c1.lease.token, result={"r": 1}))
    assert (await bundle.coord.get_job(JobId(job_id=job))).status == "running"
    bundle.clock.set(149)
    assert (await bundle.coord.reap()).reaped == 1
    assert (await bundle.coord.get_job(JobId(job_id=job))).status == "waiting"
    bundle.clock.set(150)
    await bundle.worker("w2")
    c2 = await bundle.claim("w2")
    assert c2.job.job_id == job
    assert c2.lease.token > c1.lease.token
    assert c2.job.attempts == 2


async def test_lease_expired_exactly_at_expiry(bundle):
    await bundle.worker("w1")
    job = await bundle.enqueue()
    c = await bundle.claim("w1", lease_s=10)
    bundle.clock.advance(10)
    with pytest.raises(errors.LeaseExpired):
        await bundle.coord.renew(Renew(job_id=job, worker_id="w1", token=c.lease.token))


async def test_second_complete_refused_and_result_unchanged(bundle):
    await bundle.worker("w1")
    job = await bundle.enqueue()
    c = await bundle.claim("w1")
    await bundle.coord.complete(Complete(job_id=job, worker_id="w1", token=c.lease.token,
                                         result={"answer": [1, 2, 3]}))
    before = sqlite3.connect(bundle.db_path).execute(
        "SELECT result_json FROM jobs WHERE job_id=?", (job,)).fetchone()[0]
    with pytest.raises(errors.AlreadyCompleted):
        await bundle.coord.complete(Complete(job_id=job, worker_id="w1", token=c.lease.token,
                                             result={"answer": "other"}))
    after = sqlite3.connect(bundle.db_path).execute(
        "SELECT result_json FROM jobs WHERE job_id=?", (job,)).fetchone()[0]
    assert before == after == '{"answer":[1,2,3]}'


async def test_old_token_refused_after_reclaim(bundle):
    await bundle.worker("w1")
    await bundle.worker("w2")
    job = await bundle.enqueue()
    old = await bundle.claim("w1", lease_s=10)
    bundle.clock.advance(11)
    await bundle.coord.reap()
    await bundle.worker("w2")
    new = await bundle.claim("w2", lease_s=30)
    assert new.job.job_id == job
    t = old.lease.token
    with pytest.raises(errors.LeaseLost):
        await bundle.coord.renew(Renew(job_id=job, worker_id="w1", token=t))
    with pytest.raises(errors.LeaseLost):
        await bundle.coord.checkpoint(Checkpoint(job_id=job, worker_id="w1", token=t,
                                                 checkpoint={"step": 1}))
    with pytest.raises(errors.LeaseLost):
        await bundle.coord.complete(Complete(job_id=job, worker_id="w1", token=t, result=1))
    with pytest.raises(errors.LeaseLost):
        await bundle.coord.fail(Fail(job_id=job, worker_id="w1", token=t, error="x"))
    view = await bundle.coord.get_job(JobId(job_id=job))
    assert view.status == "running" and view.lease.worker_id == "w2"
    assert view.checkpoint is None


async def test_50_concurrent_claimers_200_jobs_each_claimed_once(bundle):
    for i in range(50):
        await bundle.worker(f"w{i}")
    jobs = {await bundle.enqueue() for _ in range(200)}
    got: list[str] = []

    async def claimer(i: int) -> None:
        while True:
            res = await bundle.claim(f"w{i}")
            if res.job is None:
                return
            got.append(res.job.job_id)

    await asyncio.gather(*(claimer(i) for i in range(50)))
    assert sorted(got) == sorted(jobs)
    assert len(set(got)) == 200
    assert bundle.coord.store.writer.stats.max_batch > 1  # group commit really batched


async def test_failing_request_in_batch_does_not_roll_back_others(bundle):
    await bundle.worker("w1")
    # one enqueue that fails inside the transaction (duplicate primary key) among good ones
    good = [bundle.coord.enqueue(__import__("coordd.wire.protocol", fromlist=["_"]).Enqueue(
        kind="k", required_role="cpu", priority=1, payload={"i": i})) for i in range(5)]

    def bad(conn, now):
        conn.execute("INSERT INTO jobs (job_id) VALUES (NULL)")  # violates NOT NULL

    bad_fut = bundle.coord.store.writer.submit(bad)
    results = await asyncio.gather(*good, return_exceptions=True)
    with pytest.raises(errors.CoordError):
        await bad_fut
    assert all(r.created for r in results)
    assert (await bundle.coord.status()).jobs["waiting"] == 5


async def test_retryable_fail_backs_off_and_permanent_dead_letters(bundle):
    await bundle.worker("w1")
    job = await bundle.enqueue(max_attempts=2)
    c = await bundle.claim("w1")
    res = await bundle.coord.fail(Fail(job_id=job, worker_id="w1", token=c.lease.token,
                                       error="503 upstream", retryable=True))
    assert res.status == "waiting" and res.run_at >= T0 + 5.0
    assert (await bundle.claim("w1")).job is None  # not before its run_at
    bundle.clock.set(res.run_at)
    await bundle.worker("w1")
    c2 = await bundle.claim("w1")
    assert c2.job.job_id == job and c2.job.attempts == 2
    res2 = await bundle.coord.fail(Fail(job_id=job, worker_id="w1", token=c2.lease.token,
                                        error="503 again", retryable=True))
    assert res2.status == "failed"
    view = await bundle.coord.get_job(JobId(job_id=job))
    assert view.last_error == "attempts exhausted (last: 503 again)"
    perm = await bundle.enqueue(max_attempts=5)
    c3 = await bundle.claim("w1")
    assert c3.job.job_id == perm
    res3 = await bundle.coord.fail(Fail(job_id=perm, worker_id="w1", token=c3.lease.token,
                                        error="404 not found", retryable=False))
    assert res3.status == "failed" and res3.run_at is None
    v3 = await bundle.coord.get_job(JobId(job_id=perm))
    assert v3.attempts == 1 and v3.last_error == "permanent: 404 not found"


async def test_expired_lease_counts_as_attempt(bundle):
    await bundle.worker("w1")
    job = await bundle.enqueue(max_attempts=1)
    await bundle.claim("w1", lease_s=5)
    bundle.clock.advance(6)
    await bundle.coord.reap()
    view = await bundle.coord.get_job(JobId(job_id=job))
    assert view.status == "failed"
    assert view.last_error == "attempts exhausted (last: lease_expired)"


async def test_status_on_new_database_is_all_zero(bundle):
    st = await bundle.coord.status()
    assert st.workers == 0 and st.active_leases == 0
    assert st.jobs == {"waiting": 0, "running": 0, "succeeded": 0, "failed": 0,
                       "cancelled": 0, "blocked": 0, "skipped": 0}
    assert (await bundle.coord.check())["quick_check"] == "ok"


async def test_cancel_waiting_and_running(bundle):
    await bundle.worker("w1")
    waiting = await bundle.enqueue(priority=3)
    running = await bundle.enqueue(priority=0)
    c = await bundle.claim("w1")
    assert c.job.job_id == running
    assert (await bundle.coord.cancel(JobId(job_id=waiting))).status == "cancelled"
    assert (await bundle.coord.cancel(JobId(job_id=running))).status == "running"
    r = await bundle.coord.renew(Renew(job_id=running, worker_id="w1", token=c.lease.token))
    assert r.cancel_requested is True
    res = await bundle.coord.fail(Fail(job_id=running, worker_id="w1", token=c.lease.token,
                                       error="cancelled by supervisor"))
    assert res.status == "cancelled"
    assert (await bundle.coord.retry(JobId(job_id=waiting))).status == "waiting"


async def test_list_jobs_pages_and_filters(bundle):
    ids = [await bundle.enqueue(priority=i % 4) for i in range(7)]
    page1 = await bundle.coord.list_jobs(ListJobs(limit=4))
    page2 = await bundle.coord.list_jobs(ListJobs(limit=4, after=page1.next_after))
    assert [j.job_id for j in page1.jobs + page2.jobs] == ids
    assert page2.next_after is None
    p3 = await bundle.coord.list_jobs(ListJobs(priority=3))
    assert {j.job_id for j in p3.jobs} == {ids[3]}
    with pytest.raises(errors.BadRequest):
        await bundle.coord.list_jobs(ListJobs(status="bogus"))


async def test_enqueue_validation(bundle):
    from coordd.wire.protocol import Enqueue
    with pytest.raises(errors.BadRequest):
        await bundle.coord.enqueue(Enqueue(kind="k", required_role="cpu", priority=4))
    with pytest.raises(errors.BadRequest):
        await bundle.coord.enqueue(Enqueue(kind="", required_role="cpu", priority=1))
    with pytest.raises(errors.BadRequest):
        await bundle.coord.enqueue(Enqueue(kind="k", required_role="cpu", priority=1,
                                           gates={"max_temp": 3}))
    assert (await bundle.coord.status()).jobs["waiting"] == 0


async def test_claim_with_kinds_only_takes_kinds_the_worker_runs(bundle):
    """A worker never receives (and so never dead-letters) a kind it cannot run."""
    await bundle.worker("w1")
    train = await bundle.enqueue(priority=0, kind="train")
    kw = await bundle.enqueue(priority=2, kind="keywords")
    from coordd.wire.protocol import Claim
    res = await bundle.coord.claim(Claim(worker_id="w1", kinds=["keywords"]))
    assert res.job.job_id == kw
    none = await bundle.coord.claim(Claim(worker_id="w1", kinds=["keywords"]))
    assert none.job is None and none.reasons == ["no_matching_role"]
    res2 = await bundle.coord.claim(Claim(worker_id="w1"))
    assert res2.job.job_id == train


async def test_list_jobs_newest_first_and_unknown_after(bundle):
    ids = [await bundle.enqueue() for _ in range(5)]
    page = await bundle.coord.list_jobs(ListJobs(limit=3, newest_first=True))
    assert [j.job_id for j in page.jobs] == ids[::-1][:3]
    rest = await bundle.coord.list_jobs(ListJobs(limit=3, newest_first=True,
                                                 after=page.next_after))
    assert [j.job_id for j in rest.jobs] == ids[1::-1]
    with pytest.raises(errors.NotFound):  # an unknown `after` never restarts from the top
        await bundle.coord.list_jobs(ListJobs(after="nosuchjob"))


async def test_wal_grown_behind_a_reader_is_cut_back_and_status_warns(make_bundle):
    """A reader pinning old pages lets the WAL grow past its limit; `status` warns. Once the
    reader is gone, the next checkpoint lets the WAL restart and it is cut back down."""
    import os
    import sqlite3
    b = await make_bundle(wal_size_limit_bytes=128 << 10, warn_wal_bytes=8 << 20)
    await b.enqueue()
    pin = sqlite3.connect(b.db_path, isolation_level=None)
    pin.execute("BEGIN")
    pin.execute("SELECT count(*) FROM jobs").fetchone()  # a read transaction holds its snapshot
    for i in range(400):
        await b.enqueue(payload={"pad": "x" * 3000, "i": i})
    grown = os.stat(b.db_path + "-wal").st_size
    st = await b.coord.status()
    assert grown > 8 << 20 and any("WAL is" in w for w in st.warnings), (grown, st.warnings)
    pin.execute("COMMIT")
    pin.close()
    for i in range(400):  # commits go on
        await b.enqueue(payload={"pad": "y" * 3000, "i": i})
    await b.coord.store.writer.checkpoint()  # what the background checkpointer runs every 0.1 s
    await b.enqueue()  # the next write restarts the WAL and cuts it back
    assert os.stat(b.db_path + "-wal").st_size < 8 << 20 < grown  # cut back, not reused at size
    assert (await b.coord.status()).warnings == []
