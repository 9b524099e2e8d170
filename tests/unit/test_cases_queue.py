"""The failure cases of shared/cases/CASES.md about queueing, clocks and storage (B31-B44),
one test per case id, on a pinned clock (FakeClock); the lease cases are in
test_cases_core.py, whose helpers these share."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time

import msgspec
import pytest

from coordd import cas, errors
from coordd.store import claim_index, jobs
from coordd.wire.protocol import ADMIN_METHODS, PARAMS, Complete, Empty, Enqueue, ListJobs
from coordd.service.reaper import Reaper
from coordd.rules.times import fmt_time
from tests.unit.test_cases_core import KiB, MiB, _complete, _db, _fail, _job, _renew

# ---------------------------------------------------------------- B31


async def _starve(b, limit_s: float) -> float | None:
    """One worker; L (P3) at t=0; a producer adds a P0 job of 5 s every 4 s. Return when
    L was claimed (seconds after t=0), or None within `limit_s`."""
    t0 = b.clock.wall()
    await b.worker("w1")
    low = await b.enqueue(priority=3, kind="idle_learning")
    next_job, busy_until, held = 0.0, 0.0, None
    while b.clock.wall() - t0 < limit_s:
        t = b.clock.wall() - t0
        if t >= next_job:
            await b.enqueue(priority=0, kind="user_request")
            next_job += 4
        if held is not None and t >= busy_until:
            await _complete(b, held[0], "w1", held[1], {"ok": 1})
            held = None
        if held is None:
            await b.worker("w1")
            c = await b.claim("w1", lease_s=60)
            if c.job is not None:
                if c.job.job_id == low:
                    return t
                held, busy_until = (c.job.job_id, c.lease.token), t + 5
        b.clock.advance(1)
    return None


async def test_b31_aging_bounds_the_wait_of_low_priority_work(make_bundle):
    aged = await make_bundle(aging_interval_s=60)
    waited = await _starve(aged, 1800)
    assert waited is not None and waited <= 600
    strict = await make_bundle()  # aging is off by default: strict priority
    assert strict.coord.config.aging_interval_s == 0
    assert await _starve(strict, 600) is None


async def test_b31_equal_effective_priorities_go_fifo_and_list_shows_them(make_bundle):
    b = await make_bundle(aging_interval_s=60)
    await b.worker("w1")
    old_p1 = await b.enqueue(priority=1)
    b.clock.advance(60)
    new_p0 = await b.enqueue(priority=0)
    b.clock.advance(10)  # old_p1 aged one step: effective P0, and older than new_p0
    listed = {j.job_id: j for j in (await b.coord.list_jobs(ListJobs())).jobs}
    assert listed[old_p1].effective_priority == 0 and listed[old_p1].age_s == 70
    assert listed[new_p0].effective_priority == 0 and listed[new_p0].age_s == 10
    await b.worker("w1")
    assert (await b.claim("w1")).job.job_id == old_p1
    assert (await b.claim("w1")).job.job_id == new_p0


# ---------------------------------------------------------------- B32


async def test_b32_reaped_job_goes_to_the_back_of_its_priority(bundle):
    p = await bundle.enqueue(priority=1, max_attempts=3)
    bundle.clock.advance(1)
    ns = [await bundle.enqueue(priority=1) for _ in range(5)]
    order, expiries = [], []
    while True:
        await bundle.worker("w1")
        c = await bundle.claim("w1", lease_s=30)
        if c.job is None:
            break
        order.append(c.job.job_id)
        if c.job.job_id == p:  # P hangs until its lease expires
            bundle.clock.advance(30)
            expiries.append(bundle.clock.wall())
            assert (await bundle.coord.reap()).reaped == 1
        else:
            bundle.clock.advance(5)
            await _complete(bundle, c.job.job_id, "w1", c.lease.token, {"ok": 1})
    assert order == [p, *ns, p, p]
    view = await _job(bundle, p)
    assert view.status == "failed" and view.attempts == 3
    finished = [(await _job(bundle, n)).finished_at for n in ns]
    assert max(finished) < expiries[-1]


# ---------------------------------------------------------------- B34


async def test_b34_expiry_decided_by_coordds_clock_only(bundle, monkeypatch):
    await bundle.worker("w1")
    job = await bundle.enqueue()
    c = await bundle.claim("w1", lease_s=30)                       # t=0 (daemon clock)
    bundle.clock.advance(5)
    fast = bundle.clock.wall() + 600                               # a CLI 10 min fast
    reap_params = msgspec.msgpack.decode(msgspec.msgpack.encode({"now": fast}),
                                         type=PARAMS["reap"])
    assert reap_params == Empty()  # no time travels with `reap`: coordd's clock decides
    assert (await bundle.coord.reap(reap_params)).reaped == 0
    bundle.clock.advance(1)                                        # t=6: W2, 10 min fast
    await bundle.worker("w2", now=fast, sent_at=fast)
    claim_params = msgspec.msgpack.decode(
        msgspec.msgpack.encode({"worker_id": "w2", "lease_s": 30, "now": fast}),
        type=PARAMS["claim"])
    assert (await bundle.coord.claim(claim_params)).job is None
    view = await _job(bundle, job)
    assert view.status == "running" and view.lease.worker_id == "w1"
    with _db(bundle) as conn:
        kind, expires = conn.execute("SELECT typeof(expires_at), expires_at FROM leases "
                                     "WHERE job_id = ?", (job,)).fetchone()
    assert kind == "real" and expires == c.lease.expires_at == bundle.clock.wall() - 6 + 30
    for tz in ("America/New_York", "Australia/Lord_Howe", "UTC"):  # other zones, DST rules
        monkeypatch.setenv("TZ", tz)
        time.tzset()
        assert (await bundle.coord.reap()).reaped == 0
        assert fmt_time(expires).endswith("Z")
    monkeypatch.undo()
    time.tzset()
    bundle.clock.advance(24)                                       # t=30: now it expires
    assert (await bundle.coord.reap()).reaped == 1


# ---------------------------------------------------------------- B35


async def test_b35_suspend_resume_jump_keeps_live_lease_and_no_busy_loop(bundle):
    await bundle.worker("w1")
    job = await bundle.enqueue()
    c = await bundle.claim("w1", lease_s=30)                       # t=0
    reaps: list[int] = []
    reaped = asyncio.Event()
    real_reap = bundle.coord.reap

    async def counting_reap(p=None):
        res = await real_reap(p)
        reaps.append(res.reaped)
        reaped.set()
        return res

    async def rounds(n: int) -> None:
        while len(reaps) < n:
            reaped.clear()
            await asyncio.wait_for(reaped.wait(), 10)

    bundle.coord.reap = counting_reap
    reaper = Reaper(bundle.coord, bundle.clock, interval=5, prune_interval=3600)
    await reaper.prune_if_due()  # the first prune now, so the loop's rounds only reap
    stop = asyncio.Event()
    task = asyncio.create_task(reaper.run(stop))
    try:
        await asyncio.sleep(0)                                     # the loop waits
        bundle.clock.advance(5)                                    # t=5: a first round
        await rounds(1)
        bundle.clock.jump_wall(7200)      # suspended 2 h: wall jumps, monotonic frozen
        for _ in range(200):
            await asyncio.sleep(0)
        assert len(reaps) == 1            # the wall jump did not wake the loop: no spin
        bundle.clock.advance(5)           # resumed; the next round comes due
        await rounds(2)
        assert reaps == [0, 0]            # the jump was seen first: A is not reaped
        bundle.clock.advance(3)           # W1's first renewal after resume (within 10 s)
        r = await _renew(bundle, job, "w1", c.lease.token)
        assert r.expires_at == bundle.clock.wall() + 30
        bundle.clock.advance(2)
        await rounds(3)
    finally:
        stop.set()
        await task
    await _complete(bundle, job, "w1", c.lease.token, {"ran": "once"})
    view = await _job(bundle, job)
    assert view.status == "succeeded" and view.attempts == 1 and sum(reaps) == 0


async def test_b35_jump_grants_a_whole_lease_but_not_to_expired_leases(bundle):
    await bundle.worker("w1")
    dead = await bundle.enqueue()
    late = await bundle.enqueue()
    assert (await bundle.claim("w1", lease_s=10)).job.job_id == dead
    c_late = await bundle.claim("w1", lease_s=30)
    bundle.clock.advance(29)          # `late` has 1 s left; `dead` expired 19 s ago
    await bundle.worker("w1")         # coordd's last look at its clocks before suspend
    bundle.clock.jump_wall(7200)
    bundle.clock.advance(9)           # the holder's first renewal, 9 s after resume
    r = await _renew(bundle, late, "w1", c_late.lease.token)
    assert r.expires_at == bundle.clock.wall() + 30
    assert (await bundle.coord.reap()).reaped == 1
    assert (await _job(bundle, dead)).status == "waiting"
    assert (await _job(bundle, late)).status == "running"


# ---------------------------------------------------------------- B37


async def test_b37_payload_cap_and_prune_shrink_the_file(make_bundle):
    b = await make_bundle(retention_s=3600.0)
    with pytest.raises(errors.PayloadTooLarge):
        await b.enqueue(payload={"blob": "x" * (2 * MiB)})
    st = await b.coord.status()
    assert sum(st.jobs.values()) == 0
    with _db(b) as conn:
        assert conn.execute("SELECT (SELECT count(*) FROM jobs) + "
                            "(SELECT count(*) FROM job_events)").fetchone()[0] == 0
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    await b.coord.store.writer.checkpoint()
    baseline = os.stat(b.db_path).st_size
    n = 60
    await b.worker("w1")
    ids = []
    for i in range(n):
        ids.append(await b.enqueue(payload={"i": i, "blob": "p" * (100 * KiB)}))
    for _ in range(n):
        c = await b.claim("w1")
        await _complete(b, c.job.job_id, "w1", c.lease.token, {"blob": "r" * (100 * KiB)})
    await b.coord.store.writer.checkpoint()
    assert os.stat(b.db_path).st_size > 10 * baseline
    assert (await b.coord.status()).prunable == 0
    b.clock.advance(3601)
    keep = await b.enqueue()  # not terminal: never pruned
    st = await b.coord.status()
    assert st.prunable == n and st.db_bytes > 10 * baseline
    res = await b.coord.prune(now=b.clock.wall())
    assert res.pruned == n
    assert os.stat(b.db_path).st_size < 2 * baseline
    st = await b.coord.status()
    assert st.prunable == 0 and st.jobs["succeeded"] == 0 and st.jobs["waiting"] == 1
    with _db(b) as conn:
        left = conn.execute("SELECT count(*) FROM job_events WHERE job_id != ?",
                            (keep,)).fetchone()[0]
    assert left == 0


async def test_b37_candidate_selection_never_reads_the_payload(bundle):
    with _db(bundle) as conn:
        plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + claim_index.SQL_PAIR_WALK,
                                           ("cpu", "k", 0, 1e18))]
    assert any("USING COVERING INDEX jobs_claim" in p for p in plan), plan
    assert "payload" not in claim_index.SQL_PAIR_WALK and "payload" not in claim_index.SQL_PAIR_LEVEL


async def test_b37_prune_keeps_shared_artifacts_and_runs_from_the_reaper(make_bundle):
    from coordd.wire.protocol import ArtifactRef
    b = await make_bundle(retention_s=100.0, prune_interval_s=50.0)
    await b.worker("w1")
    src = os.path.join(os.path.dirname(b.db_path), "result.bin")
    with open(src, "wb") as fh:
        fh.write(b"abc")
    f = cas.store_file(b.coord.artifact_dir, src)  # what a worker on coordd's host does
    art = ArtifactRef(sha256=f.sha256, size=3, path=f.path)
    first = await b.enqueue()
    c = await b.claim("w1")
    await b.coord.complete(Complete(job_id=first, worker_id="w1", token=c.lease.token,
                                    artifact=art))
    b.clock.advance(90)
    second = await b.enqueue()
    await b.worker("w1")
    c = await b.claim("w1")
    await b.coord.complete(Complete(job_id=second, worker_id="w1", token=c.lease.token,
                                    artifact=art))
    b.clock.advance(20)  # first is past retention, second not
    reaper = Reaper(b.coord, b.clock, interval=5)
    assert (await reaper.prune_if_due()).pruned == 1
    assert await reaper.prune_if_due() is None     # not due again yet
    assert (await _job(b, second)).artifact == art  # still referenced: row kept
    b.clock.advance(100)
    res = await reaper.prune_if_due()
    assert res.pruned == 1 and res.artifacts == 1
    assert "prune" in PARAMS and "prune" in ADMIN_METHODS


# ---------------------------------------------------------------- B41


def _insert_raw_job(b, job_id: str, payload_json: str, **cols) -> None:
    fields = {"job_id": job_id, "kind": "k", "required_role": "cpu", "priority": 2,
              "payload_json": payload_json, "status": "waiting", "max_attempts": 3,
              "run_at": 0.0, "queued_at": 0.0, "created_at": 0.0, "updated_at": 0.0, **cols}
    with _db(b) as conn:
        conn.execute(f"INSERT INTO jobs ({', '.join(fields)}) "
                     f"VALUES ({', '.join('?' * len(fields))})", tuple(fields.values()))


async def test_b41_undecodable_payload_dead_lettered_once(bundle):
    _insert_raw_job(bundle, "bad", '{"texts": ["an older version trunc')
    good = [await bundle.enqueue(payload={"i": i}) for i in range(3)]
    await bundle.worker("w1")
    got = []
    for _ in range(4):
        c = await bundle.claim("w1")
        if c.job is not None:
            got.append(c.job.job_id)
            await _complete(bundle, c.job.job_id, "w1", c.lease.token, {"ok": True})
    assert got == good
    for _ in range(3):  # never re-queued in a loop, never handed out
        bundle.clock.advance(3600)
        await bundle.coord.reap()
        await bundle.worker("w1")
        assert (await bundle.claim("w1")).job is None
    view = await _job(bundle, "bad")
    assert view.status == "failed" and view.attempts == 1
    assert view.last_error.startswith("payload_decode_error")
    assert [e.reason for e in view.events] == ["payload_decode_error"]
    assert "undecodable" in view.payload
    st = await bundle.coord.status()
    assert st.jobs["failed"] == 1 and st.jobs["succeeded"] == 3
    failed = (await bundle.coord.list_jobs(ListJobs(status="failed"))).jobs
    assert [j.job_id for j in failed] == ["bad"]


async def test_b41_other_undecodable_columns_dead_lettered_too(bundle):
    _insert_raw_job(bundle, "bad_ckpt", "{}", checkpoint_json="{not json")
    _insert_raw_job(bundle, "bad_gates", "{}", gates_json="[1,")
    ok = await bundle.enqueue()
    await bundle.worker("w1")
    assert (await bundle.claim("w1")).job.job_id == ok
    assert (await bundle.claim("w1")).job is None
    for job_id, code in (("bad_ckpt", "checkpoint_decode_error"),
                         ("bad_gates", "gates_decode_error")):
        view = await _job(bundle, job_id)
        assert view.status == "failed" and view.last_error.startswith(code)
        assert view.attempts == 1


# ---------------------------------------------------------------- B43


async def test_b43_idempotent_enqueue_survives_lost_reply(bundle):
    assert "RETURNING job_id" in jobs.SQL_ENQUEUE  # insert and id in one statement
    req = Enqueue(kind="k", required_role="cpu", priority=1, payload={"a": 1},
                  idempotency_key="K")
    lost = asyncio.create_task(bundle.coord.enqueue(req))
    await asyncio.sleep(0)  # queued to the writer, then the reply is dropped
    lost.cancel()
    retries = [await bundle.coord.enqueue(req) for _ in range(3)]
    assert {r.job_id for r in retries} == {retries[0].job_id}
    assert [r.created for r in retries] == [False, False, False]
    with _db(bundle) as conn:
        assert conn.execute("SELECT count(*) FROM jobs WHERE idempotency_key = 'K'"
                            ).fetchone()[0] == 1


async def test_b43_busy_file_reports_nothing_stored_and_retry_is_exact(make_bundle):
    b = await make_bundle(busy_timeout_ms=100)
    req = Enqueue(kind="k", required_role="cpu", priority=1, idempotency_key="K2")
    outside = sqlite3.connect(b.db_path, isolation_level=None)
    try:
        outside.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        with pytest.raises(errors.Overloaded) as exc:
            await b.coord.enqueue(req)
        assert "database is locked" not in exc.value.message
        outside.execute("ROLLBACK")
    finally:
        outside.close()
    first = await b.coord.enqueue(req)
    again = [await b.coord.enqueue(req) for _ in range(3)]
    assert first.created and not any(r.created for r in again)
    assert {r.job_id for r in again} == {first.job_id}
    assert (await b.coord.status()).jobs["waiting"] == 1


# ---------------------------------------------------------------- B44


async def test_b44_waiting_jobs_say_why(make_bundle):
    b = await make_bundle(backoff_base_s=300.0, backoff_jitter=0.0)
    await b.worker("w1", roles=["cpu"], temperature_c=82.0)
    a = await b.enqueue(role="gpu")
    job_b = await b.enqueue(gates={"max_temperature_c": 70})
    job_c = await b.enqueue()
    c = await b.claim("w1")
    assert c.job.job_id == job_c
    res = await _fail(b, job_c, "w1", c.lease.token, "503", retryable=True)
    assert res.run_at == b.clock.wall() + 300
    checked = fmt_time(b.clock.wall())
    b.clock.advance(7)
    want = {
        a: "no live worker with role gpu",
        job_b: f"gate temperature 82 > 70 on w1 (checked {checked})",
        job_c: f"backoff until {fmt_time(res.run_at)}",
    }
    for job_id, reason in want.items():
        assert (await _job(b, job_id)).waiting_reason == reason
    listed = (await b.coord.list_jobs(ListJobs(status="waiting"))).jobs
    assert {j.job_id: j.waiting_reason for j in listed} == want
    (w,) = (await b.coord.workers()).workers
    assert w.worker_id == "w1" and w.heartbeat_age_s == 7 and w.live


async def test_b37_retention_removes_old_artifact_files_and_nothing_else(make_bundle, tmp_path):
    """Prune deletes the artifact file of a pruned job; a file a kept job refers to, a
    checkpoint file, and a fresh unrecorded file (a worker mid-store) all stay."""
    from coordd import cas
    from coordd.wire.protocol import ArtifactRef, Checkpoint, Complete
    b = await make_bundle(retention_s=100.0, warn_artifact_bytes=250)
    store_dir = b.coord.artifact_dir

    def put(name: bytes) -> cas.StoredFile:
        src = tmp_path / "src.bin"
        src.write_bytes(name * 100)
        return cas.store_file(store_dir, str(src))

    async def run_with_artifact(name: bytes) -> cas.StoredFile:
        await b.worker("w1")
        job = await b.enqueue()
        c = await b.claim("w1")
        f = put(name)
        await b.coord.complete(Complete(job_id=job, worker_id="w1", token=c.lease.token,
                                        result={"a": f.sha256},
                                        artifact=ArtifactRef(sha256=f.sha256, size=f.size,
                                                             path=f.path)))
        return f

    old = await run_with_artifact(b"old")
    b.clock.advance(150)  # old's job is now past retention; the next one is not
    kept = await run_with_artifact(b"kept")
    running = await b.enqueue()
    c = await b.claim("w1")
    ck = put(b"ckpt")
    await b.coord.checkpoint(Checkpoint(job_id=running, worker_id="w1", token=c.lease.token,
                                        checkpoint={"path": ck.path, "sha256": ck.sha256}))
    fresh = put(b"fresh")  # stored by a worker, not recorded yet: mtime is the real now
    for f in (old, kept, ck):  # written long ago on coordd's (pinned) clock
        os.utime(f.path, (b.clock.wall() - 10_000, b.clock.wall() - 10_000))
    res = await b.coord.prune()
    assert res.pruned == 1 and res.artifact_files == 1
    assert not os.path.exists(old.path)
    for f in (kept, ck, fresh):
        assert os.path.exists(f.path), f
    warnings = (await b.coord.status()).warnings  # 3 files of 400-500 bytes stay
    assert any(w.startswith("artifact store is") for w in warnings), warnings
