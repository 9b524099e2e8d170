"""A claim costs the same however many waiting jobs it cannot take wait ahead of its own
(issue 21, finding 9): jobs of another kind (a worker naming its kinds) or another role
(a worker naming none). The cost is counted in SQLite VM instructions for one claim
(a progress handler), which does not depend on how busy the machine is; the latency at
1 k / 100 k / 1 M jobs ahead is in bench/pressure.py."""

from __future__ import annotations

import pytest

AHEAD = 20_000
STEP = 100  # VM instructions per progress-handler call

SQL_LOAD = (
    "INSERT INTO jobs (job_id, kind, required_role, priority, payload_json, status, "
    "max_attempts, run_at, queued_at, created_at, updated_at) "
    "VALUES (?, ?, ?, 0, '{}', 'waiting', 3, 0, 0, 0, 0)"
)


async def _claim_cost(bundle, kinds, worker: str) -> int:
    conn = bundle.coord.store.writer._conn
    units = [0]

    def tick() -> int:
        units[0] += 1
        return 0

    conn.set_progress_handler(tick, STEP)
    try:
        got = await bundle.claim(worker, kinds=kinds)
    finally:
        conn.set_progress_handler(None, STEP)
    assert got.job is not None and got.job.kind == "b", got.reasons
    return units[0] * STEP


@pytest.mark.parametrize("foreign,kinds", [(("a", "cpu"), ["b"]), (("b", "gpu"), None)],
                         ids=["other-kind", "other-role"])
async def test_claim_cost_is_flat_in_jobs_it_cannot_take(make_bundle, foreign, kinds):
    empty, full = await make_bundle(), await make_bundle()
    for b in (empty, full):
        await b.worker("w", roles=["cpu"])
        for _ in range(3):
            await b.enqueue(priority=1, role="cpu", kind="b")
    await full.coord.store.writer.run(lambda conn, now: conn.executemany(
        SQL_LOAD, ((f"ahead{i:06d}", *foreign) for i in range(AHEAD))))  # P0: ahead of b
    base = await _claim_cost(empty, kinds, "w")
    cost = await _claim_cost(full, kinds, "w")
    # before: the walk stepped over every job ahead (~20 instructions each: ~400 k here)
    assert cost <= 1.2 * base + 2_000, (base, cost)
