"""`status` answers from counters the writer's triggers keep (issue 21, finding 4): after
random operations of every kind that moves a job (enqueue, batches, claims, completes,
retryable and permanent fails, expired leases, cancels, retries, workflows with their
promotions and skips, prune, wall-clock steps), the counters equal a full count of the jobs table, and
the queue latency equals a full scan's (now - the oldest ready time of a due waiting job).
The read costs the same at any size."""

from __future__ import annotations

import random
import sqlite3

import msgspec
import pytest

from coordd import store
from coordd.store import schema, views
from coordd.wire.protocol import Complete, Enqueue, EnqueueBatch, Fail, JobId, ListJobs
from coordd.wire.workflows import WorkflowId, WorkflowSubmit

ROLES = ("cpu", "gpu")
KINDS = ("a", "b", "c")


def _graph(rnd: random.Random, n: int) -> WorkflowSubmit:
    nodes = [{"name": "n0", "kind": rnd.choice(KINDS), "required_role": rnd.choice(ROLES)}]
    for i in range(1, n):
        need = {"node": f"n{rnd.randrange(i)}", "policy": rnd.choice(["skip", "run"])}
        nodes.append({"name": f"n{i}", "kind": rnd.choice(KINDS),
                      "required_role": rnd.choice(ROLES), "needs": [need]})
    return msgspec.convert({"name": "g", "nodes": nodes}, WorkflowSubmit)


async def _check(b) -> None:
    jobs, waiting = await b.coord.store.readers.run(views.full_counts)
    st = await b.coord.status()
    assert st.jobs == jobs and st.waiting_by_priority == waiting
    read = b.coord.store.readers.run
    oldest = await read(lambda conn: conn.execute(  # a full scan, by the definition
        "SELECT min(max(queued_at, run_at)) FROM jobs NOT INDEXED WHERE status = 'waiting' "
        "AND max(queued_at, run_at) <= ?", (st.now,)).fetchone()[0])
    want = None if oldest is None else st.now - oldest
    assert st.oldest_waiting_age_s == pytest.approx(want) if want is not None \
        else st.oldest_waiting_age_s is None


@pytest.mark.parametrize("seed", range(6))
async def test_counters_equal_a_full_count_after_random_operations(make_bundle, seed):
    rnd = random.Random(seed)
    b = await make_bundle(retention_s=50.0, workflow_absent_wait_s=30.0)
    held: list[tuple[str, str, int]] = []  # (job, worker, token)
    for step in range(120):
        b.clock.advance(rnd.choice([0.0, 0.5, 2.0, 20.0]))
        op = rnd.choice(["enqueue", "enqueue", "batch", "claim", "claim", "complete",
                         "fail", "cancel", "retry", "workflow", "wcancel", "reap", "prune",
                         "tick", "step"])
        try:
            if op == "enqueue":
                await b.enqueue(priority=rnd.randrange(4), role=rnd.choice(ROLES),
                                kind=rnd.choice(KINDS), max_attempts=rnd.choice([1, 2]),
                                idempotency_key=rnd.choice([None, None, f"k{rnd.randrange(5)}"]))
            elif op == "batch":
                await b.coord.enqueue_batch(EnqueueBatch(jobs=[
                    Enqueue(kind=rnd.choice(KINDS), required_role=rnd.choice(ROLES),
                            priority=rnd.randrange(4), payload={})
                    for _ in range(rnd.randrange(1, 6))]))
            elif op == "claim":
                w = rnd.choice(["w1", "w2"])
                await b.worker(w, roles=list(ROLES))
                got = await b.claim(w, lease_s=rnd.choice([10.0, 30.0]),
                                    kinds=rnd.choice([None, ["a"], ["b", "c"]]))
                if got.job is not None:
                    held.append((got.job.job_id, w, got.lease.token))
            elif op in ("complete", "fail") and held:
                job, w, token = held.pop(rnd.randrange(len(held)))
                if op == "complete":
                    await b.coord.complete(Complete(job_id=job, worker_id=w, token=token,
                                                    result={"ok": 1}))
                else:
                    await b.coord.fail(Fail(job_id=job, worker_id=w, token=token, error="x",
                                            retryable=rnd.random() < 0.6))
            elif op in ("cancel", "retry"):
                ids = await b.coord.store.readers.run(lambda conn: [r[0] for r in conn.execute(
                    "SELECT job_id FROM jobs")])
                if ids:
                    fn = b.coord.cancel if op == "cancel" else b.coord.retry
                    await fn(JobId(job_id=rnd.choice(ids)))
            elif op == "workflow":
                await b.coord.workflow_submit(_graph(rnd, rnd.randrange(2, 6)))
            elif op == "wcancel":
                wids = await b.coord.store.readers.run(lambda conn: [r[0] for r in conn.execute(
                    "SELECT workflow_id FROM workflows")])
                if wids:
                    await b.coord.workflow_cancel(WorkflowId(workflow_id=rnd.choice(wids)))
            elif op == "reap":
                await b.coord.reap()
            elif op == "prune":
                await b.coord.prune()
            elif op == "tick":
                await b.coord.flows.tick()
            elif op == "step":  # a wall-clock step: the writer moves waiting jobs' times
                b.clock.jump_wall(rnd.choice([-600.0, 45.0]))
                await b.worker("w1", roles=list(ROLES))
        except Exception as exc:  # refusals (invalid_state, lease_expired...) are fine here
            if getattr(exc, "code", "internal") == "internal":
                raise
        await _check(b)


async def test_counters_survive_the_migration_from_a_database_that_had_jobs(tmp_path):
    """A database made before the counters (v6) gets them filled from one full count."""
    path = str(tmp_path / "v6.db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys=ON")
    schema.migrate(conn, 6)
    for i, (status, prio) in enumerate([("waiting", 1), ("waiting", 1), ("succeeded", 2),
                                         ("failed", 0)]):
        conn.execute("INSERT INTO jobs (job_id, kind, required_role, priority, payload_json, "
                     "status, max_attempts, run_at, queued_at, created_at, updated_at) "
                     "VALUES (?, 'k', 'cpu', ?, '{}', ?, 3, 0, 0, 0, 0)", (f"j{i}", prio, status))
    store.migrate(conn)
    jobs, waiting = views.full_counts(conn)
    _w, _l, _n, got_jobs, got_waiting, _o = views.status_counts(conn, 10.0, 30.0)
    assert got_jobs == jobs and got_waiting == waiting
    assert jobs["waiting"] == 2 and waiting["p1"] == 2 and jobs["failed"] == 1
    conn.close()


def test_status_reads_no_job_rows():
    """The status statements are a read of the counter table and index seeks: no scan of
    jobs (120 ms at 1 M jobs before, issue 21)."""
    conn = sqlite3.connect(":memory:")
    store.migrate(conn)
    from coordd.store.counters import SQL_COUNTS
    from coordd.store.latency import SQL_OLDEST_READY
    for sql, args in ((SQL_COUNTS, ()), (SQL_OLDEST_READY, (0.0,))):
        plan = " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args))
        assert "SCAN jobs" not in plan, plan
    plan = " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + SQL_OLDEST_READY,
                                                 (0.0,)))
    assert "SEARCH jobs USING INDEX jobs_ready (<expr><?)" in plan, plan


async def test_queue_latency_counts_runnable_jobs_since_they_became_runnable(make_bundle):
    """`oldest_waiting_age_s` is Sidekiq's queue latency: jobs not yet due (scheduled, in
    backoff) do not count, and a job counts from when it became runnable: enqueued, or
    its backoff or schedule ended."""
    b = await make_bundle(backoff_base_s=10.0, backoff_jitter=0.0)
    t0 = b.clock.wall()
    later = await b.enqueue(run_at=t0 + 100.0)
    assert (await b.coord.status()).oldest_waiting_age_s is None  # nothing is due yet
    b.clock.advance(5.0)
    first = await b.enqueue()
    b.clock.advance(20.0)
    assert (await b.coord.status()).oldest_waiting_age_s == pytest.approx(20.0)
    await b.worker("w1")
    got = await b.claim("w1")
    assert got.job.job_id == first
    b.clock.advance(3.0)
    await b.coord.fail(Fail(job_id=first, worker_id="w1", token=got.lease.token,
                            error="flaky", retryable=True))  # backoff 10 s
    assert (await b.coord.status()).oldest_waiting_age_s is None
    b.clock.advance(14.0)  # due 4 s ago
    assert (await b.coord.status()).oldest_waiting_age_s == pytest.approx(4.0)
    b.clock.advance(70.0)  # `later` is due since 8 s; `first` since 74 s
    st = await b.coord.status()
    assert st.oldest_waiting_age_s == pytest.approx(74.0) and st.jobs["waiting"] == 2
    assert later in {j.job_id for j in (await b.coord.list_jobs(
        ListJobs(status="waiting"))).jobs}
    assert "coordd_queue_latency_seconds 74.0" in (await b.coord.metrics()).text
