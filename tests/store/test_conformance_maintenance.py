"""Maintenance over both stores (coordd.store.api_maintenance): prune by retention (jobs,
their events but the newest, logs, the artifact records only they referred to; ended
workflows after their jobs), the prunable count, the integrity check on a sound and on a
broken database, the size figures, and backup (SQLite: a verified copy; PostgreSQL:
refused, naming pg_dump); the same answers from SQLite and PostgreSQL, `now` pinned."""

from __future__ import annotations

import hashlib

import pytest

from coordd import errors
from coordd.ids import JobIds
from coordd.store.api import LeaseRef
from coordd.store.api_workflows import NewNode, NewWorkflow
from tests.store.conftest import T0


async def raw(b, sql_sqlite: str | None, sql_pg: str | None, *args) -> None:
    """A statement behind the interface's back (a broken row, a hand-made reference);
    None: nothing to do on that store."""
    if b.kind == "sqlite":
        if sql_sqlite is not None:
            await b.store.writer.run(lambda conn, _now: conn.execute(sql_sqlite, args))
    elif sql_pg is not None:
        async with b.store._conn() as conn:
            await conn.execute(sql_pg, *args)


async def finished(b, now=T0, worker="w1", **kw) -> tuple[str, LeaseRef]:
    """A job run and completed at `now` (finished_at = now)."""
    job = await b.enqueue(now=now, **kw)
    await b.worker(worker, now=now)
    got = await b.claim(worker, now=now)
    ref = LeaseRef(job, worker, got.lease.token)
    await b.store.log_append(ref, "stdout", 0, b"output", now=now)
    await b.store.complete(ref, '"ok"', now=now)
    return job, ref


async def test_prune_deletes_old_terminal_jobs_with_their_events_and_logs(bundle):
    b = bundle
    old, _ = await finished(b, now=T0)
    waiting = await b.enqueue(now=T0, role="gpu")
    young, _ = await finished(b, now=T0 + 50)
    head = await b.store.last_event_id()
    assert await b.store.prunable(T0 + 10) == 1
    assert await b.store.prunable(T0 + 100) == 2
    assert await b.store.prunable(T0 + 100, most=1) == 1
    assert await b.store.prune_jobs(T0 + 10, now=T0 + 100) == (1, 0)
    assert await b.store.job_status(old) is None
    assert await b.store.job_status(waiting) == "waiting"
    assert await b.store.job_status(young) == "succeeded"
    with pytest.raises(errors.NotFound):
        await b.store.job_logs(old, 0, None, 1 << 20)
    assert {e.job_id for e in await b.store.feed(0, 100, now=T0 + 100)} == {waiting, young}
    assert await b.store.prune_jobs(T0 + 10, now=T0 + 100) == (0, 0)
    assert await b.store.prune_jobs(T0 + 100, limit=5, now=T0 + 100) == (1, 0)
    newest = await b.store.feed(0, 100, now=T0 + 100)
    assert newest[-1].event_id == head  # the newest event of all stays (a cursor)
    assert await b.store.last_event_id() == head


async def test_prune_drops_the_artifact_records_only_pruned_jobs_referred_to(bundle):
    b = bundle
    data = b"a large result"
    sha = hashlib.sha256(data).hexdigest()
    await b.worker("w0")
    holder = await b.enqueue(now=T0, max_attempts=1)
    got = await b.claim("w0", now=T0, lease_s=1000.0)
    put = await b.store.artifact_put(LeaseRef(holder, "w0", got.lease.token), sha, len(data),
                                     0, data, now=T0)
    old, _ = await finished(b, now=T0 + 1)
    kept, _ = await finished(b, now=T0 + 50)
    for job in (old, kept):  # a complete with the artifact (PostgreSQL: its record is there)
        await raw(b, "INSERT OR IGNORE INTO artifacts (sha256, path, size, created_at) "
                  "VALUES (?, ?, ?, ?)", None, sha, put.path, len(data), T0)
        await raw(b, "UPDATE jobs SET artifact_sha256 = ? WHERE job_id = ?",
                  "UPDATE jobs SET artifact_sha256 = $1 WHERE job_id = $2", sha, job)
    assert await b.store.artifact_refs() == {sha: put.path}
    assert await b.store.prune_jobs(T0 + 10, now=T0 + 100) == (1, 0)  # still referred to
    assert await b.store.prune_jobs(T0 + 100, now=T0 + 100) == (1, 1)
    assert await b.store.artifact_refs() == {}
    await b.store.artifact_sweep(T0 + 10, now=T0 + 100)  # SQLite: the file goes here
    with pytest.raises(errors.NotFound):
        await b.store.artifact_get(LeaseRef(holder, "w0", got.lease.token), sha, 0, 10,
                                   now=T0 + 100)


async def test_an_ended_workflow_goes_after_its_last_job(bundle):
    b = bundle
    ids = JobIds()
    wf = NewWorkflow(workflow_id=ids.new(T0), name="wf", nodes=[NewNode(
        job_id=ids.new(T0), name="a", kind="k", required_role="cpu", priority=2, payload={},
        max_attempts=1)])
    await b.store.workflow_submit(wf, now=T0)
    await b.worker("w1", now=T0)
    got = await b.claim("w1", now=T0)
    await b.store.complete(LeaseRef(got.job.job_id, "w1", got.lease.token), "1", now=T0 + 1)
    assert (await b.store.workflow_get(wf.workflow_id)).status == "succeeded"
    assert await b.store.prunable(T0 + 1) == 0  # its workflow ended at T0 + 1 too
    assert await b.store.prune_workflows(T0 + 10, now=T0 + 100) == 0  # its job is there
    assert await b.store.prune_jobs(T0 + 10, now=T0 + 100) == (1, 0)
    assert await b.store.prune_workflows(T0 + 10, now=T0 + 100) == 1
    with pytest.raises(errors.NotFound):
        await b.store.workflow_get(wf.workflow_id)


async def test_the_integrity_check_finds_a_running_job_without_its_lease(bundle):
    b = bundle
    await finished(b)
    running = await b.enqueue(now=T0)
    await b.claim("w1", now=T0)
    sound = await b.store.integrity_check()
    assert (sound.quick_check, sound.foreign_key_violations, sound.invariants) == ("ok", 0, [])
    await raw(b, "DELETE FROM leases WHERE job_id = ?", "DELETE FROM leases WHERE job_id = $1",
              running)
    broken = await b.store.integrity_check()
    assert broken.quick_check == "ok" and broken.invariants == ["1 running job(s) without a lease"]


async def test_the_figures_and_a_few_steps_that_may_do_nothing(bundle):
    b = bundle
    await finished(b)
    db, wal = await b.store.storage_bytes()
    assert db > 0 and wal >= 0
    assert await b.store.vacuum_step(now=T0) >= 0
    await b.store.checkpoint_wal()
    await b.store.optimize(now=T0)


async def test_backup_copies_sqlite_and_is_refused_on_postgres_naming_pg_dump(bundle, tmp_path):
    b = bundle
    await finished(b)
    dest = str(tmp_path / "copy.db")
    if b.kind == "postgres":
        with pytest.raises(errors.InvalidState, match="pg_dump"):
            await b.store.backup(dest)
        return
    res = await b.store.backup(dest)
    assert (res.path, res.quick_check, res.jobs) == (dest, "ok", 1)



async def test_a_maintenance_window_serves_the_round_as_maintenance(bundle):
    """Inside `maintenance_window` the store's calls work as outside it (both stores); on
    SQLite the writes go in the writer's urgent lane, apart from the producers' work (the
    reaper enters it for every round), and only inside it."""
    b = bundle
    job, _ = await finished(b, now=T0)
    with b.store.maintenance_window():
        if b.kind == "sqlite":
            lanes = b.store.writer._lanes
            fut = b.store.writer.submit(lambda conn, now: None)
            assert (len(lanes.urgent), len(lanes.new)) == (1, 0)
            await fut
        assert await b.store.prune_jobs(T0 + 10, now=T0 + 100) == (1, 0)
        assert await b.store.reap(now=T0 + 100) == 0
    assert await b.store.job_status(job) is None
    if b.kind == "sqlite":
        fut = b.store.writer.submit(lambda conn, now: None)
        assert (len(lanes.urgent), len(lanes.new)) == (0, 1)  # the window is closed
        await fut
