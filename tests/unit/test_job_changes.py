"""The writer's job hook (coordd.store.sqlite.job_changes): the status counters it keeps are exact
through op rollbacks, failed batches and writes by other connections; no trigger program
of the file runs per job row; a claim that names no kinds reads its role's kinds once per
refresh, not once per claim, and still sees a kind the moment a job of it waits."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from coordd import store
from coordd.store.sqlite import job_changes
from coordd.store import views
from coordd.wire.protocol import Claim, Complete
from coordd.store.claim_index import SQL_ROLE_KINDS

from tests.conftest import T0

KINDS_READ = SQL_ROLE_KINDS.split("(", 1)[0]  # traced with its parameters bound


async def _counts_exact(b) -> None:
    jobs, waiting = await b.coord.store.readers.run(views.full_counts)
    st = await b.coord.status()
    assert st.jobs == jobs and st.waiting_by_priority == waiting
    stored = await b.coord.store.readers.run(lambda conn: sorted(
        r for r in conn.execute("SELECT status, priority, n FROM job_counts") if r[2]))
    full = await b.coord.store.readers.run(lambda conn: sorted(conn.execute(
        "SELECT status, priority, count(*) FROM jobs GROUP BY status, priority")))
    assert stored == full


def test_the_file_has_no_trigger_on_jobs(tmp_path):
    """Counting is the writer's (TEMP triggers on its own connection): no trigger program
    of the file runs for each job row a claim or complete changes."""
    conn = sqlite3.connect(str(tmp_path / "x.db"), isolation_level=None)
    store.migrate(conn)
    assert conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' "
                        "AND tbl_name = 'jobs'").fetchall() == []


async def test_an_op_that_fails_after_changing_jobs_counts_nothing(bundle):
    await bundle.worker("w1")
    jobs = [await bundle.enqueue() for _ in range(3)]

    def take_then_fail(conn: sqlite3.Connection, now: float) -> None:
        conn.execute("UPDATE jobs SET status = 'cancelled', finished_at = ? WHERE job_id = ?",
                     (now, jobs[0]))
        raise RuntimeError("boom after a write")  # the writer reruns the batch

    def half_done(conn: sqlite3.Connection, now: float) -> None:
        # the second row breaks the CHECK: SQLite undoes the statement's first row too,
        # total_changes does not move, and the hook saw that first row
        conn.execute("UPDATE jobs SET status = CASE job_id WHEN ? THEN 'failed' ELSE 'nope' "
                     "END WHERE job_id IN (?, ?)", (jobs[1], jobs[1], jobs[2]))

    writer = bundle.coord.store.writer
    futs = [writer.submit(take_then_fail), writer.submit(half_done),
            writer.submit(lambda conn, now: None)]
    for fut in futs[:2]:
        with pytest.raises(Exception):
            await fut
    await futs[2]
    await _counts_exact(bundle)
    assert (await bundle.coord.status()).jobs["waiting"] == 3


async def test_a_failed_batch_counts_nothing(bundle, monkeypatch):
    await bundle.enqueue()
    writer = bundle.coord.store.writer

    def broken_flush(conn: sqlite3.Connection) -> None:
        job_changes.JobChanges.flush(writer.changes, conn)
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(writer.changes, "flush", broken_flush)
    with pytest.raises(Exception):
        await bundle.enqueue()
    monkeypatch.undo()
    await bundle.enqueue()
    await _counts_exact(bundle)
    assert (await bundle.coord.status()).jobs["waiting"] == 2


async def test_a_rolled_back_batch_of_several_ops_leaves_the_one_row_counts_exact(
        bundle, monkeypatch):
    """The counts row is rewritten once a batch (claims, completes and enqueues together):
    a batch whose transaction rolls back after that write leaves both the stored row and
    what `status` answers equal to a full count, and the same ops then count once."""
    await bundle.worker("w1")
    for _ in range(3):
        await bundle.enqueue()
    held = await bundle.claim("w1")
    writer = bundle.coord.store.writer

    def broken_flush(conn: sqlite3.Connection) -> None:
        job_changes.JobChanges.flush(writer.changes, conn)  # the row is written
        raise sqlite3.OperationalError("disk I/O error")     # then the batch rolls back

    def ops() -> list:
        return [writer.submit(lambda conn, now: store.dumps(None)),  # a no-op among them
                bundle.coord.claim(Claim(worker_id="w1", lease_s=30.0)),
                bundle.coord.complete(Complete(job_id=held.job.job_id, worker_id="w1",
                                               token=held.lease.token, result={})),
                bundle.enqueue(priority=1)]

    monkeypatch.setattr(writer.changes, "flush", broken_flush)
    failed = await asyncio.gather(*ops(), return_exceptions=True)
    assert all(isinstance(r, Exception) for r in failed[1:]), failed
    await _counts_exact(bundle)
    assert (await bundle.coord.status()).jobs == {**(await bundle.coord.status()).jobs,
                                                  "waiting": 2, "running": 1}
    monkeypatch.undo()
    done = await asyncio.gather(*ops())
    assert done[1].job is not None
    await _counts_exact(bundle)
    st = await bundle.coord.status()
    assert st.jobs["waiting"] == 2 and st.jobs["running"] == 1 and st.jobs["succeeded"] == 1


async def test_another_connections_writes_are_recounted_and_their_kinds_claimed(bundle):
    await bundle.worker("w1")
    await bundle.enqueue(kind="a")
    assert (await bundle.claim("w1")).job is not None  # the role's kinds are cached now
    other = sqlite3.connect(bundle.db_path, isolation_level=None)
    other.execute("INSERT INTO jobs (job_id, kind, required_role, priority, payload_json, "
                  "status, max_attempts, run_at, queued_at, created_at, updated_at) VALUES "
                  "('outside', 'z', 'cpu', 1, '{}', 'waiting', 1, ?1, ?1, ?1, ?1)", (T0,))
    other.close()
    got = await bundle.claim("w1")  # same instant: no refresh by time
    assert got.job is not None and got.job.job_id == "outside"
    await _counts_exact(bundle)


async def test_counts_are_recounted_at_open(make_bundle):
    b = await make_bundle()
    await b.enqueue()
    await b.coord.close()
    conn = sqlite3.connect(b.db_path, isolation_level=None)
    conn.execute("UPDATE job_totals SET counts = '[[\"waiting\", 2, 99]]'")  # edited while down
    conn.close()
    await b.coord.start()
    await _counts_exact(b)


async def test_a_claim_naming_no_kinds_reads_its_kinds_once_per_refresh(bundle):
    await bundle.worker("w1")
    for _ in range(5):
        await bundle.enqueue(kind="a")
    seen: list[str] = []
    bundle.coord.store.writer._conn.set_trace_callback(seen.append)
    try:
        for i in range(5):
            got = await bundle.claim("w1")
            assert got.job is not None
            await bundle.coord.complete(Complete(job_id=got.job.job_id, worker_id="w1",
                                                 token=got.lease.token, result={}))
            if i == 2:  # a kind the cache has not seen: claimable at once
                await bundle.enqueue(kind="b", priority=0)
                nxt = await bundle.claim("w1")
                assert nxt.job is not None and nxt.job.kind == "b"
        assert sum(s.startswith(KINDS_READ) for s in seen) == 1
        bundle.clock.advance(job_changes.KINDS_REFRESH_S + 0.5)
        await bundle.worker("w1")
        assert (await bundle.claim("w1")).job is None
        assert sum(s.startswith(KINDS_READ) for s in seen) == 2  # read again: gone kinds drop
    finally:
        bundle.coord.store.writer._conn.set_trace_callback(None)


async def test_status_takes_its_job_counts_from_the_writer_and_reads_once(bundle, monkeypatch):
    """`status` (16 dashboards poll it) costs one trip to a read connection while nothing
    waits; the job counts are the writer's committed counters, exact right after a write.
    With jobs waiting, the oldest-waiting report adds a fixed few reads (the heads of each
    waiting priority and what explains them), however long the queue."""
    reads = []
    real = bundle.coord.store.readers.run

    async def run(fn, *args, **kw):
        reads.append(getattr(fn, "__name__", fn))
        return await real(fn, *args, **kw)

    monkeypatch.setattr(bundle.coord.store.readers, "run", run)
    st = await bundle.coord.status()
    assert reads == ["status_live"], reads
    await bundle.enqueue(priority=1)
    reads.clear()
    st = await bundle.coord.status()
    assert reads[0] == "status_live" and "oldest_due" in reads and len(reads) <= 4, reads
    assert st.jobs["waiting"] == 1 and st.waiting_by_priority["p1"] == 1
    for _ in range(20):
        await bundle.enqueue(priority=1)
    reads.clear()
    await bundle.coord.status()
    assert 2 <= len(reads) <= 4, reads  # the same few reads behind 21 waiting jobs
    await _counts_exact(bundle)
