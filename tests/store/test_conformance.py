"""One conformance suite over both stores (coordd.store.api): DESIGN.md's core rules with
a pinned `now`, the same typed errors from SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from coordd import errors
from coordd.rules import gates
from coordd.store.api import JobFilter, LeaseRef
from coordd.rules.times import fmt_time
from tests.store.conftest import T0


def ref(claimed, worker_id: str, token: int | None = None) -> LeaseRef:
    return LeaseRef(claimed.job.job_id, worker_id,
                    claimed.lease.token if token is None else token)


async def test_reference_timeline(bundle):
    """Lease of 45 s at 102 expires at 147; complete@148 refused before any reap;
    reap@149 puts the job back; another worker claims it at 150 with token + 1."""
    job_id = await bundle.enqueue()
    await bundle.worker("a", now=101.0)
    got = await bundle.claim("a", now=102.0, lease_s=45.0)
    assert got.job.job_id == job_id and got.lease.expires_at == 147.0 and got.lease.token == 1
    with pytest.raises(errors.LeaseExpired):
        await bundle.store.complete(ref(got, "a"), '"late"', now=148.0)
    assert (await bundle.store.get_job(job_id, now=148.0)).status == "running"
    assert await bundle.store.reap(now=149.0) == 1
    assert await bundle.store.reap(now=149.0) == 0  # idempotent
    view = await bundle.store.get_job(job_id, now=149.0)
    assert view.status == "waiting" and view.lease is None
    await bundle.worker("b", now=149.5)
    again = await bundle.claim("b", now=150.0, lease_s=45.0)
    assert again.job.job_id == job_id and again.lease.token == 2 and again.job.attempts == 2
    with pytest.raises(errors.LeaseLost):
        await bundle.store.complete(ref(got, "a"), '"stale"', now=151.0)
    assert (await bundle.store.complete(ref(again, "b"), '"ok"', now=151.0)).status == "succeeded"
    view = await bundle.store.get_job(job_id, now=152.0)
    assert view.status == "succeeded" and view.result == "ok"
    assert [(e.from_status, e.to_status, e.worker_id, e.reason) for e in view.events] == [
        (None, "waiting", None, "enqueued"), ("waiting", "running", "a", "claimed (token 1)"),
        ("running", "waiting", "a", "lease_expired"),
        ("waiting", "running", "b", "claimed (token 2)"), ("running", "succeeded", "b", None)]
    assert [e.at for e in view.events] == [T0, 102.0, 149.0, 150.0, 151.0]


async def _holder_call(store, call: str, r: LeaseRef, now: float):
    if call == "renew":
        return await store.renew(r, 30.0, now=now)
    if call == "checkpoint":
        return await store.checkpoint(r, '{"step": 1}', now=now)
    if call == "complete":
        return await store.complete(r, '"r"', now=now)
    if call == "fail":
        return await store.fail(r, "boom", True, lambda n: 0.0, now=now)
    return await store.release(r, "vacate", now=now)


HOLDER_CALLS = ["renew", "checkpoint", "complete", "fail", "release"]


@pytest.mark.parametrize("call", HOLDER_CALLS)
async def test_every_holder_call_is_fenced(bundle, call):
    """Stale token, another worker, an expired lease, an unknown job: refused with the
    same typed error on both stores; the right lease still works afterwards."""
    await bundle.enqueue()
    await bundle.worker("a")
    got = await bundle.claim("a", now=T0 + 1, lease_s=30.0)
    store = bundle.store
    with pytest.raises(errors.LeaseLost):
        await _holder_call(store, call, ref(got, "a", token=got.lease.token + 1), T0 + 2)
    with pytest.raises(errors.LeaseLost):
        await _holder_call(store, call, ref(got, "b"), T0 + 2)
    with pytest.raises(errors.LeaseExpired):
        await _holder_call(store, call, ref(got, "a"), T0 + 31)  # == expires_at: expired
    with pytest.raises(errors.NotFound):
        await _holder_call(store, call, LeaseRef("nope", "a", 1), T0 + 2)
    assert (await store.get_job(got.job.job_id, now=T0 + 2)).status == "running"
    await _holder_call(store, call, ref(got, "a"), T0 + 2)  # the live lease is accepted


async def test_renew_extends_and_reports_cancel(bundle):
    job_id = await bundle.enqueue()
    await bundle.worker("a")
    got = await bundle.claim("a", now=T0, lease_s=10.0)
    res = await bundle.store.renew(ref(got, "a"), 20.0, now=T0 + 5)
    assert (res.expires_at, res.lease_s, res.cancel_requested) == (T0 + 25, 20.0, False)
    assert (await bundle.store.cancel(job_id, now=T0 + 6)).status == "running"
    assert (await bundle.store.renew(ref(got, "a"), 20.0, now=T0 + 7)).cancel_requested
    hb = await bundle.store.heartbeat("a", ["cpu"], {}, now=T0 + 8)
    assert hb.cancel == [job_id] and hb.now == T0 + 8
    assert (await bundle.store.complete(ref(got, "a"), '"r"', now=T0 + 9)).status == "cancelled"
    view = await bundle.store.get_job(job_id, now=T0 + 9)
    assert view.status == "cancelled" and view.result is None and not view.cancel_requested
    assert view.last_error == "cancelled before completion"
    assert [(e.to_status, e.reason) for e in view.events[-2:]] == [
        ("running", "cancel requested"), ("cancelled", "cancel requested; result dropped")]


async def test_renew_refused_past_max_runtime(bundle):
    await bundle.enqueue(max_runtime_s=10.0)
    await bundle.worker("a")
    got = await bundle.claim("a", now=T0, lease_s=30.0)
    await bundle.store.renew(ref(got, "a"), 30.0, now=T0 + 9)
    with pytest.raises(errors.LeaseLost, match="max runtime"):
        await bundle.store.renew(ref(got, "a"), 30.0, now=T0 + 11)


async def test_duplicate_result_is_refused_and_the_first_stands(bundle):
    job_id = await bundle.enqueue()
    await bundle.worker("a")
    got = await bundle.claim("a", now=T0)
    await bundle.store.complete(ref(got, "a"), '{"v": 1}', now=T0 + 1)
    with pytest.raises(errors.AlreadyCompleted):
        await bundle.store.complete(ref(got, "a"), '{"v": 2}', now=T0 + 2)
    with pytest.raises(errors.AlreadyCompleted):
        await bundle.store.renew(ref(got, "a"), 30.0, now=T0 + 2)
    assert (await bundle.store.get_job(job_id, now=T0 + 3)).result == {"v": 1}


async def test_retries_with_backoff_then_dead_letter(bundle):
    job_id = await bundle.enqueue(max_attempts=2)
    await bundle.worker("a")
    got = await bundle.claim("a", now=T0)
    res = await bundle.store.fail(ref(got, "a"), "flaky", True, lambda n: 10.0 * n, now=T0 + 1)
    assert (res.status, res.run_at) == ("waiting", T0 + 11)
    assert (await bundle.claim("a", now=T0 + 5)).job is None  # backing off
    again = await bundle.claim("a", now=T0 + 11)
    assert again.job.job_id == job_id and again.job.attempts == 2
    ev = (await bundle.store.get_job(job_id, now=T0 + 11)).events[2]
    assert (ev.to_status, ev.reason) == ("waiting", "retryable: flaky; backoff until "
                                         + fmt_time(T0 + 11))
    res = await bundle.store.fail(ref(again, "a"), "flaky", True, lambda n: 1.0, now=T0 + 12)
    assert (res.status, res.run_at) == ("failed", None)
    view = await bundle.store.get_job(job_id, now=T0 + 12)
    assert view.status == "failed" and view.last_error == "attempts exhausted (last: flaky)"
    assert view.finished_at == T0 + 12
    res = await bundle.store.retry(job_id, now=T0 + 13)  # out of the dead letter
    assert (res.status, res.run_at) == ("waiting", T0 + 13)
    view = await bundle.store.get_job(job_id, now=T0 + 13)
    assert (view.status, view.attempts, view.last_error, view.finished_at) == (
        "waiting", 0, None, None)


async def test_permanent_failure_and_expiry_exhaust_attempts(bundle):
    perm = await bundle.enqueue(priority=0)
    hung = await bundle.enqueue(priority=1, max_attempts=1)
    await bundle.worker("a")
    got = await bundle.claim("a", now=T0)
    assert got.job.job_id == perm
    res = await bundle.store.fail(ref(got, "a"), "bad input", False, lambda n: 0, now=T0 + 1)
    assert res.status == "failed"
    assert (await bundle.store.get_job(perm)).last_error == "permanent: bad input"
    await bundle.claim("a", now=T0 + 2, lease_s=5.0)
    assert await bundle.store.reap(now=T0 + 7) == 1
    view = await bundle.store.get_job(hung, now=T0 + 7)
    assert view.status == "failed" and view.last_error == "attempts exhausted (last: lease_expired)"


async def test_cancel_and_retry(bundle):
    waiting = await bundle.enqueue()
    assert (await bundle.store.cancel(waiting, now=T0 + 1)).status == "cancelled"
    assert (await bundle.store.cancel(waiting, now=T0 + 1)).status == "cancelled"
    view = await bundle.store.get_job(waiting, now=T0 + 1)
    assert view.last_error == "cancelled by admin" and view.finished_at == T0 + 1
    res = await bundle.store.retry(waiting, now=T0 + 2)
    assert (res.status, res.run_at) == ("waiting", T0 + 2)
    ev = (await bundle.store.get_job(waiting, now=T0 + 2)).events[-1]
    assert (ev.from_status, ev.to_status, ev.reason) == ("cancelled", "waiting", "retried by admin")
    with pytest.raises(errors.InvalidState):
        await bundle.store.retry(waiting, now=T0 + 3)
    await bundle.worker("a")
    got = await bundle.claim("a", now=T0 + 3)
    assert got.job.attempts == 1  # retry reset the attempts
    await bundle.store.complete(ref(got, "a"), "1", now=T0 + 4)
    with pytest.raises(errors.InvalidState):
        await bundle.store.cancel(waiting, now=T0 + 5)
    for call in (bundle.store.cancel, bundle.store.retry):
        with pytest.raises(errors.NotFound):
            await call("missing", now=T0)


async def test_cancel_requested_ends_the_job_at_reap(bundle):
    job_id = await bundle.enqueue()
    await bundle.worker("a")
    await bundle.claim("a", now=T0, lease_s=5.0)
    await bundle.store.cancel(job_id, now=T0 + 1)
    assert await bundle.store.reap(now=T0 + 5) == 1
    view = await bundle.store.get_job(job_id, now=T0 + 5)
    assert view.status == "cancelled" and view.last_error == "lease_expired after cancel"
    assert (view.events[-1].to_status, view.events[-1].reason) == ("cancelled", "lease_expired")


async def test_release_spends_no_attempt_and_keeps_the_checkpoint(bundle):
    job_id = await bundle.enqueue(max_attempts=1)
    await bundle.worker("a")
    got = await bundle.claim("a", now=T0)
    res = await bundle.store.release(ref(got, "a"), "vacate", '{"step": 7}', now=T0 + 1)
    assert (res.status, res.run_at) == ("waiting", T0 + 1)
    view = await bundle.store.get_job(job_id, now=T0 + 1)
    assert (view.attempts, view.checkpoint, view.lease) == (0, {"step": 7}, None)
    assert view.last_error == "released: vacate" and view.events[-1].reason == "released: vacate"
    again = await bundle.claim("a", now=T0 + 2)
    assert again.job.checkpoint == {"step": 7} and again.lease.token == 2


async def test_gates_refuse_by_priority_on_the_readings(bundle):
    p3 = await bundle.enqueue(priority=3)
    await bundle.worker("a", on_battery=True)
    res = await bundle.claim("a", now=T0)
    assert res.job is None and gates.ON_BATTERY in res.reasons
    p0 = await bundle.enqueue(priority=0)
    assert (await bundle.claim("a", now=T0)).job.job_id == p0  # P0 runs on battery
    await bundle.worker("a", now=T0 + 1, memory_used_pct=97.0)
    await bundle.enqueue(priority=1)
    res = await bundle.claim("a", now=T0 + 1)
    assert res.job is None and gates.MEMORY_HIGH in res.reasons
    await bundle.worker("a", now=T0 + 2)
    assert (await bundle.claim("a", now=T0 + 2)).job.priority == 1
    assert (await bundle.claim("a", now=T0 + 2)).job.job_id == p3


async def test_a_new_heartbeat_is_judged_at_the_next_claim(bundle):
    """Readings sent at the same instant as the last ones still count for the next claim
    (PostgresStore remembers a decision only for the very heartbeat it was made from)."""
    p0 = await bundle.enqueue(priority=0)
    await bundle.enqueue(priority=3)
    await bundle.worker("a")
    assert (await bundle.claim("a", now=T0)).job.job_id == p0
    await bundle.worker("a", on_battery=True)  # same now, other readings
    res = await bundle.claim("a", now=T0)
    assert res.job is None and res.reasons == [gates.ON_BATTERY]
    await bundle.worker("a", roles=["gpu"], on_battery=True)  # same readings, other roles
    res = await bundle.claim("a", now=T0)
    assert res.job is None and res.reasons == [gates.NO_MATCHING_ROLE]


async def test_unknown_and_bad_readings_follow_the_explicit_policy(bundle):
    """An unknown user-idle reading is denied at P3 (idle_unknown = deny); a reading of
    the wrong type counts as unknown (memory: allowed), never a crash."""
    p3 = await bundle.enqueue(priority=3)
    await bundle.store.heartbeat("a", ["cpu"], {"memory_used_pct": "lots", "user_idle_s": None,
                                                "on_battery": False}, now=T0)
    res = await bundle.claim("a", now=T0)
    assert res.job is None and res.reasons == [gates.USER_ACTIVE]
    p1 = await bundle.enqueue(priority=1)
    assert (await bundle.claim("a", now=T0)).job.job_id == p1
    await bundle.store.heartbeat("a", ["cpu"], {"user_idle_s": 1e4, "on_battery": False},
                                 now=T0 + 1)
    assert (await bundle.claim("a", now=T0 + 1)).job.job_id == p3


async def test_stale_or_unknown_worker_gets_nothing(bundle):
    await bundle.enqueue()
    res = await bundle.claim("ghost", now=T0)
    assert res.job is None and res.reasons == [gates.HEARTBEAT_STALE]
    await bundle.worker("a")
    res = await bundle.claim("a", now=T0 + 31)  # heartbeat_stale_s = 30
    assert res.job is None and res.reasons == [gates.HEARTBEAT_STALE]
    assert (await bundle.claim("a", now=T0 + 30)).job is not None


async def test_roles_and_kinds_filter_candidates(bundle):
    gpu = await bundle.enqueue(role="gpu", kind="train")
    await bundle.worker("c", roles=["cpu"])
    res = await bundle.claim("c", now=T0)
    assert res.job is None and res.reasons == [gates.NO_MATCHING_ROLE]
    await bundle.worker("g", roles=["gpu"])
    res = await bundle.claim("g", now=T0, kinds=["embed"])
    assert res.job is None and res.reasons == [gates.NO_MATCHING_ROLE]
    assert (await bundle.claim("g", now=T0, kinds=["embed", "train"])).job.job_id == gpu
    assert (await bundle.claim("g", now=T0)).reasons == []  # nothing runnable at all


async def test_claim_id_replays_the_live_lease(bundle):
    first = await bundle.enqueue()
    await bundle.enqueue()
    await bundle.worker("a")
    got = await bundle.claim("a", now=T0, claim_id="c-1")
    again = await bundle.claim("a", now=T0 + 1, claim_id="c-1")
    assert again.job.job_id == first and again.lease == got.lease
    assert (await bundle.store.status(30.0, now=T0 + 1)).active_leases == 1


async def test_fifo_within_priority_and_run_at(bundle):
    early = [await bundle.enqueue(now=T0 + i) for i in range(3)]
    later = await bundle.enqueue(now=T0 + 3, priority=1)
    future = await bundle.enqueue(now=T0 + 3, priority=0, run_at=T0 + 50)
    same_instant = [j.job_id for j in await bundle.store.enqueue(
        [bundle.job(), bundle.job()], now=T0 + 4)]
    await bundle.worker("a", now=T0 + 5)
    order = [(await bundle.claim("a", now=T0 + 5)).job.job_id for _ in range(6)]
    assert order == [later, *early, *same_instant]
    assert (await bundle.claim("a", now=T0 + 5)).job is None
    await bundle.worker("a", now=T0 + 50)
    assert (await bundle.claim("a", now=T0 + 50)).job.job_id == future


async def test_enqueue_idempotency_key(bundle):
    one = bundle.job(idempotency_key="k1", request_sha256="h1")
    first = (await bundle.store.enqueue([one]))[0]
    repeat = bundle.job(idempotency_key="k1", request_sha256="h1")
    again = (await bundle.store.enqueue([repeat]))[0]
    assert first.created and not again.created and again.job_id == first.job_id
    with pytest.raises(errors.InvalidState):
        await bundle.store.enqueue([bundle.job(), bundle.job(idempotency_key="k1",
                                                             request_sha256="other")])
    assert (await bundle.store.status(30.0)).jobs["waiting"] == 1  # all or none


async def test_reads_list_page_and_status(bundle):
    ids = [await bundle.enqueue(priority=p % 4) for p in range(5)]
    await bundle.worker("a")
    await bundle.claim("a", now=T0)
    page = await bundle.store.list_jobs(JobFilter(limit=2), now=T0)
    assert [j.job_id for j in page.jobs] == ids[:2] and page.next_after == ids[1]
    rest = await bundle.store.list_jobs(JobFilter(limit=10, after=page.next_after), now=T0)
    assert [j.job_id for j in rest.jobs] == ids[2:] and rest.next_after is None
    running = await bundle.store.list_jobs(JobFilter(status="running"), now=T0)
    assert [j.priority for j in running.jobs] == [0]
    with pytest.raises(errors.NotFound):
        await bundle.store.list_jobs(JobFilter(after="nope"), now=T0)
    st = await bundle.store.status(30.0, now=T0)
    assert (st.workers, st.workers_live, st.active_leases) == (1, 1, 1)
    assert st.jobs["waiting"] == 4 and st.jobs["running"] == 1 and st.jobs["succeeded"] == 0
    assert st.waiting_by_priority == {"p0": 1, "p1": 1, "p2": 1, "p3": 1}
    with pytest.raises(errors.NotFound):
        await bundle.store.get_job("nope")


async def test_status_queue_latency_counts_from_when_a_job_became_runnable(bundle):
    assert (await bundle.store.status(30.0, now=T0)).oldest_waiting_age_s is None
    await bundle.enqueue(now=T0 + 5, run_at=T0 + 50)  # due later
    assert (await bundle.store.status(30.0, now=T0 + 10)).oldest_waiting_age_s is None
    await bundle.enqueue(now=T0 + 8)
    assert (await bundle.store.status(30.0, now=T0 + 10)).oldest_waiting_age_s == 2.0
    assert (await bundle.store.status(30.0, now=T0 + 60)).oldest_waiting_age_s == 52.0


async def test_undecodable_payload_is_dead_lettered_on_claim(bundle):
    bad = await bundle.enqueue(priority=0, payload_json="{not json")
    good = await bundle.enqueue(priority=1)
    await bundle.worker("a")
    assert (await bundle.claim("a", now=T0)).job.job_id == good
    view = await bundle.store.get_job(bad, now=T0)
    assert view.status == "failed" and view.last_error.startswith(gates.PAYLOAD_DECODE_ERROR)


async def test_leadership_primitive(bundle):
    async with bundle.store.leadership("conformance") as won:
        assert won is True


async def test_job_gate_overrides(bundle):
    """A job's own gate overrides (here: P3 may run on battery) apply to its claim."""
    job = bundle.job(priority=3)
    job.gates_json = '{"require_mains": false, "power_unknown": "mains"}'
    await bundle.store.enqueue([job], now=T0)
    await bundle.worker("a", on_battery=True)
    assert (await bundle.claim("a", now=T0)).job.job_id == job.job_id


async def test_an_error_text_with_nul_bytes_still_ends_the_attempt(bundle):
    """A worker's error or release reason is free text (a crashed process's stderr may
    hold NUL bytes): the fail and the release are stored all the same, never refused
    with the job left running. PostgreSQL text cannot hold NUL: it stores U+FFFD there."""
    perm = await bundle.enqueue(priority=0)
    back = await bundle.enqueue(priority=1)
    await bundle.worker("a")
    got = await bundle.claim("a", now=T0)
    res = await bundle.store.fail(ref(got, "a"), "bad\x00byte", False, lambda n: 0, now=T0 + 1)
    assert res.status == "failed"
    view = await bundle.store.get_job(perm, now=T0 + 1)
    assert view.last_error.replace("\x00", "\ufffd") == "permanent: bad\ufffdbyte"
    assert view.events[-1].reason.replace("\x00", "\ufffd").startswith("permanent: bad\ufffd")
    got = await bundle.claim("a", now=T0 + 2)
    assert got.job.job_id == back
    res = await bundle.store.release(ref(got, "a"), "pre\x00empted", now=T0 + 3)
    assert res.status == "waiting"
    assert (await bundle.store.get_job(back, now=T0 + 3)).status == "waiting"
