"""The writer's hot path (issue 6): where batches run, what may stall the loop, the
claim walk's order, and the library internals coordd relies on."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import aiosqlite
import pytest

from coordd import errors, store
from coordd.store import claim_index, upkeep
from coordd.ids import JobIds
from coordd.wire.protocol import Enqueue, EnqueueBatch, JobId


def test_job_ids_increase_even_when_the_clock_stands_still_or_steps_back():
    ids = JobIds()
    made = [ids.new(1_800_000_000.0) for _ in range(1000)]
    made += [ids.new(1_700_000_000.0) for _ in range(10)]  # clock stepped back
    made.append(ids.new(1_800_000_001.0))
    assert made == sorted(made) and len(set(made)) == len(made)
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in made)
    assert made[-1] > made[-2]


async def test_a_batch_is_claimed_in_submission_order(bundle):
    """One enqueue_batch shares one `now`: FIFO among them is the request order."""
    await bundle.worker("w1")
    jobs = [Enqueue(kind="k", required_role="cpu", priority=2, payload={"i": i})
            for i in range(40)]
    res = await bundle.coord.enqueue_batch(EnqueueBatch(jobs=jobs))
    got = [(await bundle.claim("w1")).job.job_id for _ in range(40)]
    assert got == [r.job_id for r in res.jobs]


@pytest.mark.parametrize("sql,args", [(claim_index.SQL_PAIR_WALK, ("cpu", "k", 0, 1e18)),
                                      (claim_index.SQL_PAIR_LEVEL, ("cpu", "k", 1, 1e18, 1e18, 16))])
def test_claim_walk_is_one_index_range_per_role_and_kind_no_sort(sql, args):
    """A claim walks, per (role, kind) pair of the worker, one range of the claim index
    (led by role and kind) in claim order: no temp B-tree (v2 sorted every job tied on
    queued_at, 500 per claim after a batch), no job row read, and no job of another role
    or kind stepped over."""
    conn = sqlite3.connect(":memory:")
    store.migrate(conn)
    plan = " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args))
    assert "COVERING INDEX jobs_claim (required_role=? AND kind=? AND priority" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


def test_kinds_of_a_role_are_found_by_index_seeks():
    """A worker that names no kinds gets its pairs from a skip-scan of the claim index:
    one seek per waiting kind, never a scan of the role's jobs."""
    conn = sqlite3.connect(":memory:")
    store.migrate(conn)
    plan = " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + claim_index.SQL_ROLE_KINDS,
                                                 ("cpu",)))
    assert "COVERING INDEX jobs_claim (required_role=? AND kind>?)" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


async def test_a_level_is_given_up_after_claim_scan_refused_candidates(bundle):
    """The walk looks at CLAIM_SCAN candidates of a level at most: a passing P2 job behind
    fewer refused ones is found, one behind more is not, and the walk goes on to P3; the
    refusals are the reasons when nothing passes."""
    hot = {"max_temperature_c": 10.0}  # the worker's 50 C fails these jobs' own gates
    for _ in range(store.CLAIM_SCAN - 1):
        await bundle.enqueue(priority=2, gates=hot)
    reachable = await bundle.enqueue(priority=2)
    await bundle.worker("w1")
    assert (await bundle.claim("w1")).job.job_id == reachable
    await bundle.enqueue(priority=2, gates=hot)  # now CLAIM_SCAN refused ones lead P2
    hidden = await bundle.enqueue(priority=2)
    p3 = await bundle.enqueue(priority=3)
    assert (await bundle.claim("w1")).job.job_id == p3  # P2 given up after CLAIM_SCAN
    refused = await bundle.claim("w1")
    assert refused.job is None and refused.reasons == ["too_hot"]
    assert hidden  # still waiting: reached once the refused jobs ahead of it are gone


async def test_one_role_and_many_role_workers_claim_only_their_roles(bundle):
    """A one-role worker takes the `=` form of the candidate query, a many-role worker the
    json_each form: each gets exactly the jobs of its roles, oldest first."""
    gpu = await bundle.enqueue(role="gpu")
    cpu = await bundle.enqueue(role="cpu")
    tpu = await bundle.enqueue(role="tpu")
    await bundle.worker("one", roles=["cpu"])
    await bundle.worker("many", roles=["tpu", "gpu"])
    assert (await bundle.claim("one")).job.job_id == cpu
    assert (await bundle.claim("one")).job is None
    assert [(await bundle.claim("many")).job.job_id for _ in range(2)] == [gpu, tpu]


async def test_gate_answers_follow_each_new_heartbeat(bundle):
    """Base gate answers are remembered per stored heartbeat text, so each heartbeat's
    readings are what a claim is judged on: hot -> refused, cool -> a job, hot again ->
    refused again (not an answer remembered from before)."""
    await bundle.enqueue(priority=2)
    await bundle.enqueue(priority=2)
    await bundle.worker("w1", temperature_c=99.0)
    assert "too_hot" in (await bundle.claim("w1")).reasons
    await bundle.worker("w1")
    assert (await bundle.claim("w1")).job is not None
    await bundle.worker("w1", temperature_c=99.0)
    assert "too_hot" in (await bundle.claim("w1")).reasons


async def test_writer_runs_batches_on_the_loop_thread(bundle):
    """Decided by measurement (writer.py docstring): no thread hand-off per batch."""
    seen: list[str] = []

    def op(conn: sqlite3.Connection, now: float) -> int:
        seen.append(threading.current_thread().name)
        return 1

    assert await bundle.coord.store.writer.run(op) == 1
    assert seen == [threading.current_thread().name]


async def test_an_outside_write_lock_does_not_freeze_the_loop(make_bundle):
    """While another process holds the write lock, the writer waits with asyncio sleeps:
    reads and other coroutines go on, and the write ends `overloaded` after the budget."""
    b = await make_bundle(busy_timeout_ms=600)
    job = await b.enqueue()
    outside = sqlite3.connect(b.db_path, isolation_level=None)
    outside.execute("BEGIN IMMEDIATE")
    try:
        write = asyncio.create_task(b.enqueue())
        ticks = 0
        while not write.done():
            await asyncio.sleep(0.01)
            ticks += 1
            if ticks == 5:  # a read answers meanwhile
                assert (await b.coord.status()).jobs["waiting"] == 1
        with pytest.raises(errors.Overloaded):
            await write
        assert ticks >= 20  # the loop kept running through ~0.6 s of waiting
    finally:
        outside.execute("ROLLBACK")
        outside.close()
    assert (await b.coord.enqueue(Enqueue(kind="k", required_role="cpu", priority=1))).created
    assert (await b.coord.status()).jobs["waiting"] == 2 and job


async def test_background_checkpointer_runs_after_commits(make_bundle, monkeypatch):
    """Commits kick the checkpointer thread, which checkpoints on its own thread."""
    threads: list[str] = []
    real = upkeep.wal_checkpoint

    def spy(conn: sqlite3.Connection) -> tuple[int, int, int]:
        threads.append(threading.current_thread().name)
        return real(conn)

    monkeypatch.setattr(upkeep, "wal_checkpoint", spy)
    b = await make_bundle(wal_checkpoint_interval_s=0.01)
    for _ in range(20):
        await b.enqueue()
    for _ in range(500):  # bounded wait for the thread (real time: it is a real thread)
        if "coordd-checkpointer" in threads:
            break
        await asyncio.sleep(0.01)
    assert "coordd-checkpointer" in threads


async def test_aiosqlite_internals_the_reader_relies_on(tmp_path):
    """The read side runs one function per read on aiosqlite's thread through the private
    `Connection._execute(fn, *args)` with `Connection._conn` (one hand-off per read, not
    one per statement). Pinned in pyproject (aiosqlite>=0.22,<0.23); this fails if a new
    version changes either."""
    db = await aiosqlite.connect(str(tmp_path / "x.db"))
    try:
        assert isinstance(db._conn, sqlite3.Connection)
        where: list[str] = []

        def fn(conn: sqlite3.Connection, x: int) -> int:
            where.append(threading.current_thread().name)
            return conn.execute("SELECT ?", (x,)).fetchone()[0]

        assert await db._execute(fn, db._conn, 7) == 7
        assert where and where[0] != threading.current_thread().name
    finally:
        await db.close()


async def test_a_batch_lingers_while_requests_keep_arriving(bundle):
    """Group commit linger: requests submitted over the next loop iterations join the
    batch of the first one (one COMMIT for all), as long as each iteration brings one."""
    writer = bundle.coord.store.writer
    loop = asyncio.get_running_loop()
    futs: list[asyncio.Future] = []

    def op(conn: sqlite3.Connection, now: float) -> int:
        return len(futs)

    def submit_then_again(left: int) -> None:  # one submit per loop iteration
        futs.append(writer.submit(op))
        if left > 1:
            loop.call_soon(submit_then_again, left - 1)

    await asyncio.sleep(0)
    before = writer.stats.batches
    submit_then_again(3)
    await asyncio.gather(*futs)
    assert len(futs) == 3
    assert writer.stats.batches - before == 1  # all three in one transaction


async def test_linger_is_bounded_and_a_lone_request_is_not_held(bundle):
    """A producer that submits on every iteration cannot hold a batch open forever: it
    closes after `linger_rounds` iterations; and a lone request commits by itself."""
    writer = bundle.coord.store.writer
    loop = asyncio.get_running_loop()
    futs: list[asyncio.Future] = []
    all_sent = loop.create_future()

    def op(conn: sqlite3.Connection, now: float) -> None:
        return None

    def flood(left: int) -> None:
        futs.append(writer.submit(op))
        if left > 1:
            loop.call_soon(flood, left - 1)
        else:
            all_sent.set_result(None)

    before = writer.stats.batches
    flood(40)
    await all_sent
    await asyncio.gather(*futs)
    assert writer.stats.max_batch <= writer._linger_rounds + 2
    assert writer.stats.batches - before >= 40 // (writer._linger_rounds + 2)
    before = writer.stats.batches
    assert await writer.run(op) is None  # alone: committed without anyone else arriving
    assert writer.stats.batches == before + 1


async def test_an_op_failing_after_its_writes_rolls_back_alone(bundle):
    """One savepoint per batch: an op that raises after changing rows sends the batch back
    and it runs again with a savepoint per op; only that op's rows are gone."""
    writer = bundle.coord.store.writer
    writer_ran: list[str] = []

    def put(name: str, fail: bool = False):
        def op(conn: sqlite3.Connection, now: float) -> int:
            writer_ran.append(name)
            conn.execute("INSERT INTO artifacts (sha256, path, size, created_at) "
                         "VALUES (?, 'p', 1, 0)", (name,))
            if fail:
                raise errors.InvalidState(f"{name} changed its mind")
            return conn.execute("SELECT count(*) FROM artifacts").fetchone()[0]
        return op

    reruns = writer.stats.reruns
    futs = [writer.submit(put("t-a")), writer.submit(put("t-b", fail=True)),
            writer.submit(put("t-c"))]
    results = await asyncio.gather(*futs, return_exceptions=True)
    assert results[0] == 1 and results[2] == 2  # as if t-b had never run
    assert isinstance(results[1], errors.InvalidState)
    assert writer.stats.reruns == reruns + 1
    assert writer_ran == ["t-a", "t-b", "t-a", "t-b", "t-c"]
    keys = await bundle.coord.store.readers.run(
        lambda conn: [r[0] for r in conn.execute("SELECT sha256 FROM artifacts ORDER BY 1")])
    assert keys == ["t-a", "t-c"]


async def test_an_op_refused_before_writing_needs_no_rerun(bundle):
    """The usual failure (a fence check, a refused claim) changes no row: the batch goes on
    under its one savepoint and every other op is kept."""
    writer = bundle.coord.store.writer
    job = await bundle.enqueue()
    reruns = writer.stats.reruns

    def refuse(conn: sqlite3.Connection, now: float) -> None:
        conn.execute("SELECT 1").fetchone()
        raise errors.LeaseLost("not yours")

    def internal_bug(conn: sqlite3.Connection, now: float) -> None:
        raise ZeroDivisionError("bug")

    futs = [writer.submit(refuse), writer.submit(internal_bug),
            writer.submit(lambda conn, now: conn.execute(
                "UPDATE jobs SET priority = 0 WHERE job_id = ?", (job,)).rowcount)]
    results = await asyncio.gather(*futs, return_exceptions=True)
    assert isinstance(results[0], errors.LeaseLost)
    assert type(results[1]) is errors.CoordError and "ZeroDivisionError" in str(results[1])
    assert results[2] == 1
    assert writer.stats.reruns == reruns
    assert (await bundle.coord.get_job(JobId(job_id=job))).priority == 0


def _put(name: str, cancel_transaction: bool = False):
    """An op inserting artifact row `name`; with `cancel_transaction` its INSERT fails the
    way SQLITE_FULL / IOERR / NOMEM / INTERRUPT can: SQLite rolls back the whole
    transaction, not just the statement (a progress handler interrupting the write)."""
    def op(conn: sqlite3.Connection, now: float) -> str:
        if cancel_transaction:
            conn.set_progress_handler(lambda: 1, 1)
        try:
            conn.execute("INSERT INTO artifacts (sha256, path, size, created_at) "
                         "VALUES (?, 'p', 1, 0)", (name,))
        finally:
            conn.set_progress_handler(None, 1)
        return name
    return op


async def test_an_op_whose_error_cancels_the_transaction_ends_the_batch(bundle):
    """After an error that made SQLite roll back the whole transaction (no row counted
    in total_changes), the later ops of the batch must not run in autocommit: their rows
    would be stored while every reply says nothing was. Each reply matches the rows."""
    writer = bundle.coord.store.writer
    futs = [writer.submit(_put("x-a")), writer.submit(_put("x-b", cancel_transaction=True)),
            writer.submit(_put("x-c"))]
    results = await asyncio.gather(*futs, return_exceptions=True)
    keys = await bundle.coord.store.readers.run(
        lambda conn: [r[0] for r in conn.execute("SELECT sha256 FROM artifacts ORDER BY 1")])
    for name, res in zip(("x-a", "x-b", "x-c"), results):
        assert (name in keys) == (not isinstance(res, BaseException)), (name, res, keys)
    assert not writer._conn.in_transaction
    assert await writer.run(_put("x-d")) == "x-d"  # the writer goes on


async def test_a_rerun_op_whose_error_cancels_the_transaction_ends_the_batch(bundle):
    """The same in the rerun with a savepoint per op."""
    writer = bundle.coord.store.writer
    tries = {"n": 0}

    def write_then_fail(conn: sqlite3.Connection, now: float) -> None:
        conn.execute("INSERT INTO artifacts (sha256, path, size, created_at) "
                     "VALUES ('y-w', 'p', 1, 0)")
        raise errors.InvalidState("changed its mind")

    def cancel_on_rerun(conn: sqlite3.Connection, now: float) -> str:
        tries["n"] += 1
        return _put("y-b", cancel_transaction=tries["n"] > 1)(conn, now)

    futs = [writer.submit(_put("y-a")), writer.submit(cancel_on_rerun),
            writer.submit(write_then_fail), writer.submit(_put("y-c"))]
    results = await asyncio.gather(*futs, return_exceptions=True)
    keys = await bundle.coord.store.readers.run(
        lambda conn: [r[0] for r in conn.execute("SELECT sha256 FROM artifacts ORDER BY 1")])
    assert tries["n"] == 2
    for name, res in zip(("y-a", "y-b", "y-w", "y-c"), results):
        assert (name in keys) == (not isinstance(res, BaseException)), (name, res, keys)


async def test_a_lone_op_runs_without_a_savepoint_and_fails_alone(bundle):
    """A batch of one op runs without SAVEPOINT / RELEASE (two statements less a batch on
    the one-client path): an op that fails after writing has the whole transaction rolled
    back, gets its own error (not "commit failed"), and the next batch goes on."""
    writer = bundle.coord.store.writer
    traced: list[str] = []

    def write_then_fail(conn: sqlite3.Connection, now: float) -> None:
        conn.execute("INSERT INTO artifacts (sha256, path, size, created_at) "
                     "VALUES ('lone', 'p', 1, 0)")
        conn.execute("UPDATE jobs SET priority = 0")  # a job hook row, rolled back too
        raise errors.InvalidState("changed its mind")

    job = await bundle.enqueue()
    writer._conn.set_trace_callback(traced.append)
    try:
        with pytest.raises(errors.InvalidState):
            await writer.run(write_then_fail)
        assert await writer.run(_put("after")) == "after"
    finally:
        writer._conn.set_trace_callback(None)
    assert not any(s.startswith(("SAVEPOINT", "RELEASE")) for s in traced), traced
    assert not writer._conn.in_transaction
    keys = await bundle.coord.store.readers.run(
        lambda conn: [r[0] for r in conn.execute("SELECT sha256 FROM artifacts ORDER BY 1")])
    assert keys == ["after"]
    assert (await bundle.coord.get_job(JobId(job_id=job))).priority == 2
    st = await bundle.coord.status()
    assert st.jobs["waiting"] == 1 and st.waiting_by_priority["p2"] == 1


async def test_a_lone_op_rolled_back_leaves_the_outside_write_recount_to_the_next(bundle):
    """The batch a lone failing op rolled back began with a recount (another connection
    wrote): the recount is rolled back with it and taken again by the next batch."""
    writer = bundle.coord.store.writer
    await bundle.enqueue()
    other = sqlite3.connect(bundle.db_path, isolation_level=None)
    other.execute("UPDATE jobs SET status = 'cancelled', finished_at = 1")
    other.close()

    def write_then_fail(conn: sqlite3.Connection, now: float) -> None:
        conn.execute("INSERT INTO artifacts (sha256, path, size, created_at) "
                     "VALUES ('lone', 'p', 1, 0)")
        raise errors.InvalidState("changed its mind")

    with pytest.raises(errors.InvalidState):
        await writer.run(write_then_fail)
    await writer.run(lambda conn, now: None)
    st = await bundle.coord.status()
    assert st.jobs.get("waiting", 0) == 0 and st.jobs["cancelled"] == 1
    stored = await bundle.coord.store.readers.run(lambda conn: sorted(
        r for r in conn.execute("SELECT status, priority, n FROM job_counts") if r[2]))
    assert stored == [("cancelled", 2, 1)]
