"""The web view's read-only methods (coordd.service.web_reads, issue 19) on a pinned clock."""

from __future__ import annotations

import pytest

from coordd import errors
from coordd.wire.protocol import Complete, Fail, JobId
from coordd.wire.web import FindJobs, JobStats, MessageLog, WorkflowRef
from coordd.wire.workflows import WorkflowNode, WorkflowSubmit


async def test_find_jobs_pages_newest_first_with_filters_and_counts(bundle):
    ids = [await bundle.enqueue(kind="a" if i % 2 else "b", payload={"n": i, "tag": f"T{i}"})
           for i in range(7)]
    c = bundle.coord
    page = await c.find_jobs(FindJobs(limit=3))
    assert [j.job_id for j in page.jobs] == ids[::-1][:3]
    assert page.count == 7 and page.exact and page.next_before == ids[4]
    page2 = await c.find_jobs(FindJobs(limit=3, before=page.next_before))
    assert [j.job_id for j in page2.jobs] == ids[::-1][3:6]
    last = await c.find_jobs(FindJobs(limit=3, before=page2.next_before))
    assert [j.job_id for j in last.jobs] == [ids[0]] and last.next_before is None
    kind_a = await c.find_jobs(FindJobs(kind="a"))
    assert [j.job_id for j in kind_a.jobs] == [ids[5], ids[3], ids[1]]
    assert kind_a.count == 3 and not kind_a.exact and not kind_a.count_capped
    text = await c.find_jobs(FindJobs(text="t4"))  # case-insensitive, in the payload
    assert [j.job_id for j in text.jobs] == [ids[4]]
    waiting = await c.find_jobs(FindJobs(status="waiting", priority=2))
    assert waiting.count == 7 and waiting.exact


async def test_find_jobs_window_bounds_each_page_and_continues(bundle):
    """A rare match costs at most `scan` rows a page; the cursor goes on past the window."""
    ids = [await bundle.enqueue(kind="rare" if i == 0 else "common") for i in range(6)]
    c = bundle.coord
    first = await c.find_jobs(FindJobs(kind="rare", scan=4))
    assert first.jobs == [] and first.scanned == 4 and first.next_before == ids[2]
    second = await c.find_jobs(FindJobs(kind="rare", scan=4, before=first.next_before))
    assert [j.job_id for j in second.jobs] == [ids[0]] and second.next_before is None


async def test_find_jobs_by_worker_and_refusals(bundle):
    a = await bundle.enqueue()
    b = await bundle.enqueue()
    await bundle.worker("w1")
    got = await bundle.claim("w1")
    assert got.job.job_id == a
    held = await bundle.coord.find_jobs(FindJobs(worker="w1"))
    assert [(j.job_id, j.worker_id) for j in held.jobs] == [(a, "w1")]
    assert b not in [j.job_id for j in held.jobs]
    with pytest.raises(errors.BadRequest):
        await bundle.coord.find_jobs(FindJobs(status="nope"))
    with pytest.raises(errors.BadRequest):
        await bundle.coord.find_jobs(FindJobs(limit=0))
    with pytest.raises(errors.NotFound):
        await bundle.coord.find_jobs(FindJobs(before="no-such-job"))


async def test_job_stats_buckets_finished_jobs_and_fleet_keeps_readings(bundle):
    ok, bad = await bundle.enqueue(), await bundle.enqueue(max_attempts=1)
    await bundle.worker("w1", memory_used_pct=41.0)
    for job_id in (ok, bad):
        got = await bundle.claim("w1")
        bundle.clock.advance(20)
        if job_id == ok:
            await bundle.coord.complete(Complete(job_id=job_id, worker_id="w1",
                                                 token=got.lease.token, result={}))
        else:
            await bundle.coord.fail(Fail(job_id=job_id, worker_id="w1", token=got.lease.token,
                                         error="boom", retryable=False))
    await bundle.worker("w1", memory_used_pct=55.0)
    stats = await bundle.coord.job_stats(JobStats(window_s=600, bucket_s=60))
    assert len(stats.bucket_starts) == 10 and sum(stats.succeeded) == 1
    assert sum(stats.failed) == 1 and stats.counts["succeeded"][2] == 1
    assert stats.head_event_id > 0
    fleet = await bundle.coord.fleet()
    assert [r["memory_used_pct"] for _, r in fleet.readings["w1"]] == [41.0, 55.0]
    assert fleet.held == []
    with pytest.raises(errors.BadRequest):
        await bundle.coord.job_stats(JobStats(window_s=10**9, bucket_s=1))


async def test_job_stats_buckets_sit_on_whole_minutes_and_count_each_ended_job_once(bundle):
    """Buckets are epoch multiples of bucket_s, so a refresh 25 s later keeps every job in
    its bucket; each job counts once, at its last end (a retried attempt is no end, a job
    retried by hand and failed again is one failed job); cancelled and skipped apart."""
    c = bundle.coord
    bundle.clock.advance(3600 * 10 + 17)  # not on a minute
    await bundle.worker("w1")
    twice, gone = await bundle.enqueue(max_attempts=1), await bundle.enqueue(role="nobody")

    async def fail(job_id, retryable):
        got = await bundle.claim("w1")
        assert got.job.job_id == job_id
        bundle.clock.advance(5)
        await c.fail(Fail(job_id=job_id, worker_id="w1", token=got.lease.token,
                          error="boom", retryable=retryable))
    await fail(twice, False)
    await c.retry(JobId(job_id=twice))
    bundle.clock.advance(1)
    await fail(twice, False)  # failed again: still one failed job
    flaky = await bundle.enqueue()
    await fail(flaky, True)  # a failed attempt, back to waiting after backoff
    bundle.clock.advance(120)
    await bundle.worker("w1")  # a fresh heartbeat after the backoff
    got = await bundle.claim("w1")
    await c.complete(Complete(job_id=flaky, worker_id="w1", token=got.lease.token, result={}))
    await c.cancel(JobId(job_id=gone))
    stats = await c.job_stats(JobStats(window_s=600, bucket_s=60))
    assert all(t % 60 == 0 for t in stats.bucket_starts)
    assert stats.bucket_starts[-1] <= stats.now < stats.bucket_starts[-1] + 60
    assert (sum(stats.succeeded), sum(stats.failed), sum(stats.cancelled),
            sum(stats.skipped)) == (1, 1, 1, 0)
    where = {k: [(t, n) for t, n in zip(stats.bucket_starts, getattr(stats, k)) if n]
             for k in ("succeeded", "failed", "cancelled")}
    bundle.clock.advance(25)
    later = await c.job_stats(JobStats(window_s=600, bucket_s=60))
    assert {k: [(t, n) for t, n in zip(later.bucket_starts, getattr(later, k)) if n]
            for k in where} == where


async def test_find_jobs_says_why_a_waiting_job_waits(bundle):
    await bundle.worker("w1")
    held = await bundle.enqueue()
    lonely = await bundle.enqueue(role="nobody")
    assert (await bundle.claim("w1")).job.job_id == held
    later = await bundle.enqueue(delay_s=600)
    rows = {j.job_id: j for j in (await bundle.coord.find_jobs(FindJobs())).jobs}
    assert rows[lonely].waiting_reason == "no live worker with role nobody"
    assert rows[later].waiting_reason.startswith("scheduled until ")
    assert rows[held].waiting_reason is None and rows[held].worker_id == "w1"


async def test_workflow_runs_and_message_log(bundle):
    sub = await bundle.coord.workflow_submit(WorkflowSubmit(name="wf", nodes=[
        WorkflowNode(name="a", kind="k", required_role="cpu")]))
    await bundle.worker("w1")
    got = await bundle.claim("w1")
    bundle.clock.advance(5)
    await bundle.coord.complete(Complete(job_id=got.job.job_id, worker_id="w1",
                                         token=got.lease.token, result={}))
    runs = (await bundle.coord.workflow_runs(WorkflowRef(workflow_id=sub.workflow_id))).runs
    assert [(r.node, r.worker_id, r.outcome) for r in runs] == [("a", "w1", "succeeded")]
    assert runs[0].end - runs[0].start == 5
    log = await bundle.coord.message_log(MessageLog())
    assert log.messages == [] and log.next_before is None


async def test_find_jobs_with_a_status_lists_the_latest_change_first(bundle):
    """The dead letter reads most recently failed first (the jobs_status index), and a
    status page continues by that order too."""
    a, b, c = await bundle.enqueue(), await bundle.enqueue(), await bundle.enqueue()
    await bundle.worker("w1")
    leases = {}
    for _ in range(3):
        got = await bundle.claim("w1")
        leases[got.job.job_id] = got.lease.token
    for job_id in (b, c, a):  # a fails last
        bundle.clock.advance(1)
        await bundle.coord.fail(Fail(job_id=job_id, worker_id="w1", token=leases[job_id],
                                     error="x", retryable=False))
    by_change = await bundle.coord.find_jobs(FindJobs(status="failed", limit=2))
    assert [j.job_id for j in by_change.jobs] == [a, c] and by_change.exact
    rest = await bundle.coord.find_jobs(FindJobs(status="failed", before=by_change.next_before))
    assert [j.job_id for j in rest.jobs] == [b] and rest.next_before is None
    assert [j.job_id for j in (await bundle.coord.find_jobs(FindJobs())).jobs] == [c, b, a]
    window = await bundle.coord.find_jobs(FindJobs(status="failed", kind="k", scan=2))
    assert [j.job_id for j in window.jobs] == [a, c] and window.next_before == c
    last = await bundle.coord.find_jobs(FindJobs(status="failed", kind="k", scan=2,
                                                 before=window.next_before))
    assert [j.job_id for j in last.jobs] == [b] and last.next_before is None
