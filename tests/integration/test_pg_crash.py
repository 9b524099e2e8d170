"""Crash rounds of coordd on the PostgreSQL store: real coordd processes on the session's
throwaway cluster, real clients enqueueing, claiming and completing over the socket,
coordd SIGKILLed mid-drain again and again and started again on the same database (in
the slow rounds a standby takes over instead, every other kill).

What must hold after every kill, read from the database itself: every acknowledged
enqueue stored under its idempotency key; every acknowledged complete stored `succeeded`
with exactly its result, once; at most one lease a job, `running` iff a lease, the lease's
token the job's last; no double claim (every `running` event follows a `waiting` one in
the job's log). At the end every job is drained and ends once: one `succeeded` event.

Default run: one database, 2 kills (several seconds). `pytest -m slow`: 12 kills with
standby take-overs, under more load.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from coordd.client import SyncClient
from tests.integration.test_crash import COOL, Acked, _enqueuer, _worker
from tests.integration.test_pg_daemon import Rig, pg_db  # noqa: F401 - the fixture

LEASE_S = 2.0  # longer than a load phase: no lease expires while its holder lives
CFG = "restart_grace = false\n"  # orphaned leases expire after LEASE_S, then are reaped
ENDED = ("succeeded", "failed", "cancelled")


async def check_db(dsn: str, acked: Acked) -> dict[str, int]:
    """Every rule of the module docstring, on the stored rows; returns counts by status."""
    import asyncpg
    conn = await asyncpg.connect(dsn)
    try:
        jobs = {r["job_id"]: r for r in await conn.fetch(
            "SELECT job_id, status, result_json, last_token, idempotency_key, finished_at "
            "FROM jobs")}
        leases = [tuple(r) for r in await conn.fetch("SELECT job_id, token FROM leases")]
        events: dict[str, list[tuple[str | None, str]]] = {}
        for r in await conn.fetch("SELECT job_id, from_status, to_status FROM job_events "
                                  "ORDER BY event_id"):
            events.setdefault(r[0], []).append((r[1], r[2]))
    finally:
        await conn.close()
    for key, job_id in acked.enqueued:
        assert job_id in jobs, f"acknowledged enqueue {job_id} ({key}) lost"
        assert jobs[job_id]["idempotency_key"] == key
    for job_id, _token, result in acked.completed:
        row = jobs[job_id]
        assert row["status"] == "succeeded", f"acknowledged complete of {job_id}: {row['status']}"
        assert json.loads(row["result_json"]) == result, f"{job_id}: {row['result_json']}"
    lease_of = dict(leases)
    assert len(lease_of) == len(leases), "two leases for one job"
    for job_id, row in jobs.items():
        assert (row["status"] == "running") == (job_id in lease_of), \
            f"{job_id}: {row['status']}, lease {job_id in lease_of}"
        if job_id in lease_of:
            assert lease_of[job_id] == row["last_token"], f"{job_id}: lease token not the last"
        if row["status"] == "succeeded":
            assert row["result_json"] is not None and row["finished_at"] is not None
        log = events.get(job_id, [])
        assert log and log[0] == (None, "waiting"), f"{job_id}: log starts {log[:1]}"
        for (_f, prev), (frm, to) in zip(log, log[1:]):  # one chain: no double claim
            assert frm == prev, f"{job_id}: {frm}->{to} after {prev} (a double claim?)"
        assert [to for _f, to in log].count("succeeded") <= 1, f"{job_id} succeeded twice"
        assert log[-1][1] == row["status"], f"{job_id}: log ends {log[-1]}, is {row['status']}"
    for job_id, token in acked.claimed:
        assert jobs[job_id]["last_token"] >= token, f"{job_id}: token went back below {token}"
    assert len(set(acked.claimed)) == len(acked.claimed), "one token granted twice"
    counts = {s: 0 for s in ("waiting", "running", *ENDED)}
    for row in jobs.values():
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    counts["_leases"] = len(leases)
    return counts


def _load(sock: str, phase: int, acked: Acked, enqueuers: int, workers: int
          ) -> tuple[threading.Event, list[threading.Thread]]:
    stop = threading.Event()
    threads = [threading.Thread(target=_enqueuer, args=(sock, phase * 100 + n, acked, stop),
                                kwargs={"max_attempts": 50}, daemon=True)
               for n in range(enqueuers)]
    threads += [threading.Thread(target=_worker, args=(sock, phase * 100 + n, acked, stop),
                                 kwargs={"lease_s": LEASE_S}, daemon=True)
                for n in range(workers)]
    for t in threads:
        t.start()
    return stop, threads


def _status(sock: str) -> Any:
    with SyncClient(sock, timeout=10) as c:
        return c.status()


async def _drain(sock: str, acked: Acked, timeout: float) -> None:
    """Claim and complete until every job has ended (orphans come back once reaped)."""
    deadline = time.monotonic() + timeout

    def run() -> None:
        with SyncClient(sock, timeout=10) as c:
            while time.monotonic() < deadline:
                c.heartbeat("drainer", ["cpu"], COOL)
                got = c.claim("drainer", lease_s=30, claim_id=uuid.uuid4().hex)
                if got.job is None:
                    st = c.status()
                    if st.jobs.get("waiting", 0) == 0 and st.jobs.get("running", 0) == 0:
                        return
                    time.sleep(0.1)
                    continue
                acked.claimed.append((got.job.job_id, got.lease.token))
                result = {"by": "drainer", "job": got.job.job_id}
                res = c.complete(got.job.job_id, "drainer", got.lease.token, result)
                assert res.status == "succeeded"
                acked.completed.append((got.job.job_id, got.lease.token, result))
            raise AssertionError("the drain did not end in time")
    await asyncio.to_thread(run)


async def crash_rounds(rig: Rig, kills: int, seed: int, enqueuers: int = 2, workers: int = 2,
                       standby: bool = False) -> dict[str, Any]:
    """`kills` SIGKILLs mid-load on one database, then a full drain; every check after
    each kill and at the end. With `standby`, every other kill is taken over by a standby
    that waited on the advisory lock (a fresh one is started for the next time)."""
    rnd = random.Random(seed)
    acked = Acked()
    active = rig.coordd("c0", session_timeout_s=2.0)
    await active.wait_serving()
    waiting = None
    summary: dict[str, Any] = {"kills": kills}
    takeovers = []
    for phase in range(kills):
        if standby and phase % 2 == 0 and waiting is None:
            waiting = rig.coordd(f"s{phase}", session_timeout_s=2.0)
            await waiting.wait_log("standby: waiting for the active coordd")
        stop, threads = _load(active.socket, phase, acked, enqueuers, workers)
        await asyncio.sleep(rnd.uniform(0.2, 0.7))
        active.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        await asyncio.to_thread(active.proc.wait, 10)
        for t in threads:
            await asyncio.to_thread(t.join, 15)
        stop.set()
        assert not any(t.is_alive() for t in threads), "a client hung after the kill"
        assert not acked.errors, acked.errors
        counts = await check_db(rig.dsn, acked)
        if waiting is not None:  # the standby leads now
            active, waiting = waiting, None
            takeovers.append(await active.wait_serving() - killed)
        else:  # start it again on the same socket and database
            active = rig.coordd(f"c{phase + 1}", socket=active.socket, session_timeout_s=2.0)
            await active.wait_serving()
        st = await asyncio.to_thread(_status, active.socket)
        assert {s: st.jobs.get(s, 0) for s in counts if not s.startswith("_")} == \
            {s: n for s, n in counts.items() if not s.startswith("_")}, (st.jobs, counts)
        assert st.active_leases == counts["_leases"]
    assert acked.enqueued and acked.completed, "nothing acknowledged: the rounds proved nothing"
    before = len(acked.completed)
    await _drain(active.socket, acked, 60)
    final = await check_db(rig.dsn, acked)
    assert final["waiting"] == final["running"] == final["_leases"] == 0, final
    # every job stored ended succeeded once (an enqueue or complete whose reply the kill
    # took is stored all the same: acknowledged ones are a subset)
    assert final["succeeded"] == sum(n for s, n in final.items() if not s.startswith("_"))
    summary.update(enqueued=len(acked.enqueued), completed_under_kills=before,
                   claims=len(acked.claimed), succeeded=final["succeeded"],
                   takeovers_ms=[round(t * 1000) for t in takeovers])
    print(f"\nPostgreSQL crash rounds seed={seed}: {summary}")
    return summary


@pytest.fixture
def crash_rig(pg_db: str, tmp_path: Path) -> Any:  # noqa: F811 - pg_db is the fixture
    from tests.integration.workerbench import stop_workers
    r = Rig(tmp_path, pg_db, [], [], config_extra=CFG)
    yield r
    stop_workers(r.workers)
    for d in r.coordds:
        d.stop()


async def test_sigkill_of_coordd_on_postgres_under_load_loses_nothing_acknowledged(crash_rig):
    await crash_rounds(crash_rig, kills=2, seed=1)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 12])
async def test_sigkill_rounds_on_postgres_with_standby_takeovers(crash_rig, seed):
    s = await crash_rounds(crash_rig, kills=12, seed=seed, enqueuers=3, workers=4,
                           standby=True)
    assert len(s["takeovers_ms"]) == 6 and max(s["takeovers_ms"]) < 5000, s
