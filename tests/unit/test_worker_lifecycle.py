"""Worker lifecycle in coordd (issue 14): incarnations end a predecessor's leases at once,
`release` hands a job back without spending an attempt, goodbye, forget, and the
waiting reason for a kind no live worker runs. Pinned clock, no sleeps."""

from __future__ import annotations

import pytest

from coordd import errors
from coordd.wire.protocol import Complete, Fail, Heartbeat, JobId, ListJobs, Renew
from coordd.wire.workers import ForgetWorker, Goodbye, Release
from tests.conftest import COOL


async def beat(bundle, worker_id="w1", incarnation=None, **fields):
    return await bundle.coord.heartbeat(Heartbeat(
        worker_id=worker_id, roles=["cpu"], readings=dict(COOL), incarnation=incarnation,
        **fields))


async def test_new_incarnation_releases_predecessor_leases_at_once(bundle):
    await beat(bundle, incarnation="a")
    job = await bundle.enqueue(max_attempts=3)
    old = await bundle.claim("w1", lease_s=300)
    assert (await beat(bundle, incarnation="a")).lost == []  # same incarnation: nothing
    bundle.clock.advance(1)
    res = await beat(bundle, incarnation="b")  # restarted: well before the lease's end
    assert res.lost == [job]
    view = await bundle.coord.get_job(JobId(job_id=job))
    assert view.status == "waiting" and view.attempts == 1 and view.lease is None
    assert view.events[-1].reason == "worker_lost" and "worker_lost" in view.last_error
    again = await bundle.claim("w1")
    assert again.job.job_id == job and again.lease.token > old.lease.token
    with pytest.raises(errors.LeaseLost):  # the predecessor's token is fenced off
        await bundle.coord.complete(Complete(job_id=job, worker_id="w1",
                                             token=old.lease.token, result={}))


async def test_worker_lost_spends_the_attempt_and_dead_letters_at_the_last(bundle):
    await beat(bundle, incarnation="a")
    job = await bundle.enqueue(max_attempts=1)
    await bundle.claim("w1")
    assert (await beat(bundle, incarnation="b")).lost == [job]
    view = await bundle.coord.get_job(JobId(job_id=job))
    assert view.status == "failed" and "worker_lost" in view.last_error


async def test_heartbeat_without_incarnation_never_releases(bundle):
    await beat(bundle, incarnation="a")
    await bundle.enqueue()
    await bundle.claim("w1")
    assert (await beat(bundle)).lost == []  # an older worker that sends none
    assert (await bundle.coord.status()).active_leases == 1


async def test_release_hands_back_without_spending_an_attempt(bundle):
    await beat(bundle, incarnation="a")
    job = await bundle.enqueue(max_attempts=1)
    c = await bundle.claim("w1")
    res = await bundle.coord.release(Release(job_id=job, worker_id="w1", token=c.lease.token,
                                             reason="spawn_failed: ENOENT",
                                             checkpoint={"step": 3}))
    assert res.status == "waiting" and res.run_at == bundle.clock.wall()
    view = await bundle.coord.get_job(JobId(job_id=job))
    assert view.attempts == 0 and view.preemptions == 1 and view.lease is None
    assert view.checkpoint == {"step": 3}
    assert view.events[-1].reason == "released: spawn_failed: ENOENT"
    with pytest.raises(errors.LeaseLost):  # the lease ended with the release
        await bundle.coord.renew(Renew(job_id=job, worker_id="w1", token=c.lease.token))
    c2 = await bundle.claim("w1")  # max_attempts=1 and still runnable: nothing was spent
    assert c2.job.job_id == job and c2.job.attempts == 1
    await bundle.coord.fail(Fail(job_id=job, worker_id="w1", token=c2.lease.token,
                                 error="boom", retryable=True))
    assert (await bundle.coord.get_job(JobId(job_id=job))).status == "failed"


async def test_release_is_fenced_and_honours_a_cancel(bundle):
    await beat(bundle)
    job = await bundle.enqueue()
    c = await bundle.claim("w1", lease_s=10)
    with pytest.raises(errors.LeaseLost):
        await bundle.coord.release(Release(job_id=job, worker_id="w2", token=c.lease.token))
    bundle.clock.advance(11)
    with pytest.raises(errors.LeaseExpired):
        await bundle.coord.release(Release(job_id=job, worker_id="w1", token=c.lease.token))
    await bundle.coord.reap()
    c2 = await bundle.claim("w1")
    await bundle.coord.cancel(JobId(job_id=job))
    res = await bundle.coord.release(Release(job_id=job, worker_id="w1", token=c2.lease.token,
                                             reason="shutdown"))
    assert res.status == "cancelled"


async def test_goodbye_marks_offline_at_once_and_ends_leftover_leases(bundle):
    await beat(bundle, incarnation="a")
    job = await bundle.enqueue()
    await bundle.claim("w1")
    assert (await bundle.coord.status()).workers_live == 1
    assert (await bundle.coord.goodbye(Goodbye(worker_id="w1", incarnation="old"))).released == []
    res = await bundle.coord.goodbye(Goodbye(worker_id="w1", incarnation="a"))
    assert res.released == [job]
    st = await bundle.coord.status()
    assert st.workers == 1 and st.workers_live == 0
    [w] = (await bundle.coord.workers()).workers
    assert w.live is False and w.offline_at == bundle.clock.wall()
    page = await bundle.coord.list_jobs(ListJobs(status="waiting"))
    assert page.jobs[0].waiting_reason == "no live worker with role cpu"
    await beat(bundle, incarnation="b")  # back: live again
    assert (await bundle.coord.workers()).workers[0].live is True


async def test_forget_refuses_live_or_leaseholding_worker_unless_forced(bundle):
    await beat(bundle, incarnation="a")
    job = await bundle.enqueue()
    await bundle.claim("w1", lease_s=300)
    with pytest.raises(errors.InvalidState, match="is live"):
        await bundle.coord.forget_worker(ForgetWorker(worker_id="w1"))
    bundle.clock.advance(60)  # silent past heartbeat_stale_s, lease still running
    with pytest.raises(errors.InvalidState, match="holds 1 lease"):
        await bundle.coord.forget_worker(ForgetWorker(worker_id="w1"))
    res = await bundle.coord.forget_worker(ForgetWorker(worker_id="w1", force=True))
    assert res.released == [job]
    assert (await bundle.coord.workers()).workers == []
    with pytest.raises(errors.NotFound):
        await bundle.coord.forget_worker(ForgetWorker(worker_id="w1"))
    await beat(bundle, "w2")
    bundle.clock.advance(60)
    assert (await bundle.coord.forget_worker(ForgetWorker(worker_id="w2"))).released == []


async def test_waiting_reason_names_a_kind_no_live_worker_runs(bundle):
    await beat(bundle, kinds=["m"], broken_kinds={"embed": "cannot execute /x: not found"})
    await beat(bundle, "w2", kinds=["m"])
    job = await bundle.enqueue(kind="embed")
    view = await bundle.coord.get_job(JobId(job_id=job))
    assert view.waiting_reason == ("no live worker runs kind embed "
                                   "(broken on w1: cannot execute /x: not found)")
    [w1, _w2] = (await bundle.coord.workers()).workers
    assert w1.kinds == ["m"] and w1.broken_kinds == {"embed": "cannot execute /x: not found"}
    ok = await bundle.enqueue(kind="m")
    assert (await bundle.coord.get_job(JobId(job_id=ok))).waiting_reason.startswith("runnable")
    await beat(bundle, "w3")  # sends no kinds (an older worker): may run any kind
    assert (await bundle.coord.get_job(JobId(job_id=job))).waiting_reason.startswith(
        "runnable")


async def test_heartbeat_kinds_are_checked(bundle):
    with pytest.raises(errors.BadRequest):
        await beat(bundle, kinds=["bad\nkind"])
    with pytest.raises(errors.BadRequest):
        await beat(bundle, broken_kinds={"": "x"})
    await beat(bundle, broken_kinds={"k": "line\x1bone" * 100})
    [w] = (await bundle.coord.workers()).workers
    assert "\x1b" not in w.broken_kinds["k"] and len(w.broken_kinds["k"]) <= 503
