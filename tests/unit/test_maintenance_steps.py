"""Maintenance runs in small steps on the writer (issue 21, finding 6): a prune of many
jobs, its vacuum and the planner statistics (`PRAGMA optimize`) are many short
transactions, each bounded in SQLite work, so a claim queued behind any of them waits
milliseconds, not the ~320 ms a full ANALYZE of 1 M jobs took. The work of each
transaction is measured in SQLite VM instructions (a progress handler), which does not
depend on how busy the machine is; bench/pressure.py measures the claim latency itself."""

from __future__ import annotations

import pytest

from coordd.store import upkeep

JOBS = 12_000  # finished long ago: pruned
KEPT = 20_000  # finished recently: kept, and the statistics must cover them
STEP = 1000  # VM instructions per progress-handler call
# A prune batch of 100 jobs with their events is ~22 k instructions, and so is the
# sampled ANALYZE; the full ANALYZE of these 20 k jobs was ~800 k (~40 M at 1 M jobs).
MAX_STEP_INSTRUCTIONS = 200_000

SQL_LOAD = (
    "INSERT INTO jobs (job_id, kind, required_role, priority, payload_json, status, "
    "max_attempts, run_at, queued_at, created_at, updated_at, finished_at) "
    "VALUES (?, 'k', 'cpu', 1, ?, 'succeeded', 3, 0, 0, 0, 0, ?)"
)
SQL_LOAD_EVENT = (
    "INSERT INTO job_events (job_id, at, worker_id, from_status, to_status, reason) "
    "VALUES (?, 0, 'w', 'running', 'succeeded', NULL)"
)


def _load(conn, now):
    rows = [(f"old{i:07d}", '{"pad": "%s"}' % ("x" * 200), 1.0) for i in range(JOBS)]
    rows += [(f"new{i:07d}", "{}", 1e9) for i in range(KEPT)]
    conn.executemany(SQL_LOAD, rows)
    conn.executemany(SQL_LOAD_EVENT, ((r[0],) for r in rows))


class Meter:
    """SQLite VM instructions per transaction of the writer's connection."""

    def __init__(self, conn) -> None:
        self.conn, self.units, self.per_txn = conn, 0, []
        conn.set_progress_handler(self._tick, STEP)
        conn.set_trace_callback(self._trace)

    def _tick(self) -> int:
        self.units += 1
        return 0

    def _trace(self, sql: str) -> None:
        if sql.startswith("BEGIN"):
            self.units = 0
        elif sql == "COMMIT":
            self.per_txn.append(self.units * STEP)

    def close(self) -> None:
        self.conn.set_progress_handler(None, STEP)
        self.conn.set_trace_callback(None)


async def test_a_big_prune_is_many_small_transactions(make_bundle):
    b = await make_bundle(retention_s=10.0)
    await b.coord.store.writer.run(_load)
    await b.worker("w")
    for _ in range(3):  # the planner uses the jobs indexes: optimize will want statistics
        await b.enqueue()
        await b.claim("w")
    await b.coord.list_jobs(store_list(status="succeeded"))
    b.clock.advance(100.0)
    meter = Meter(b.coord.store.writer._conn)
    try:
        res = await b.coord.prune()
    finally:
        meter.close()
    assert res.pruned == JOBS
    assert len(meter.per_txn) > JOBS // upkeep.PRUNE_BATCH
    assert max(meter.per_txn) < MAX_STEP_INSTRUCTIONS, sorted(meter.per_txn)[-5:]
    stat = await b.coord.store.readers.run(lambda conn: conn.execute(
        "SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchone()[0])
    assert stat == 1  # optimize did run ANALYZE, sampled


def store_list(**kw):
    from coordd.wire.protocol import ListJobs
    return ListJobs(limit=10, **kw)


@pytest.mark.parametrize("pages", [upkeep.VACUUM_PAGES])
async def test_vacuum_frees_a_bounded_number_of_pages_per_transaction(make_bundle, pages):
    b = await make_bundle(retention_s=10.0)
    await b.coord.store.writer.run(_load)
    b.clock.advance(100.0)
    free_after: list[int] = []
    real = upkeep.vacuum_step

    def step(conn, max_pages=upkeep.VACUUM_PAGES):
        before = conn.execute("PRAGMA freelist_count").fetchone()[0]
        left = real(conn, max_pages)
        free_after.append(before - left)
        return left

    upkeep.vacuum_step = step
    try:
        await b.coord.prune()
    finally:
        upkeep.vacuum_step = real
    assert sum(free_after) > pages  # there was more to free than one step may
    assert max(free_after) <= pages <= 128
