"""Cases of shared/cases/CASES.md that need real concurrency: a real coordd process, many
client processes and connections on its socket (B01, B02), and the daemon's clock as
the only judge of expiry (B34)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from coordd import errors
from coordd.client import Client, SyncClient

COOL = {"memory_used_pct": 30.0, "temperature_c": 40.0, "on_battery": False,
        "user_idle_s": 10_000.0}
LOCKED = "database is locked"
ROUND_TIMEOUT_S = 60.0


def _spawn() -> mp.context.BaseContext:
    return mp.get_context("spawn")  # no fork of a process that holds event loops


# ---------------------------------------------------------------- B01


def _claimer(sock: str, idx: int, rounds: int, barrier, results) -> None:
    """One claimer process with its own connection: each round, claim once at the barrier."""
    worker = f"w{idx}"
    with SyncClient(sock, timeout=30) as c:
        for rnd in range(rounds):
            try:
                c.heartbeat(worker, ["cpu"], COOL)
            except Exception as exc:  # reported, never hidden
                results.put((rnd, idx, f"ERROR heartbeat {type(exc).__name__}: {exc}"))
            barrier.wait(ROUND_TIMEOUT_S)           # main has enqueued this round's job
            try:
                res = c.claim(worker, lease_s=600)
                out = res.job.job_id if res.job is not None else None
            except Exception as exc:
                out = f"ERROR claim {type(exc).__name__}: {exc}"
            results.put((rnd, idx, out))
            barrier.wait(ROUND_TIMEOUT_S)           # the round is over


@pytest.mark.parametrize("rounds", [10, pytest.param(500, marks=pytest.mark.slow)])
def test_b01_16_claimer_processes_one_winner_per_round(daemon, rounds):
    n = 16
    ctx = _spawn()
    barrier, results = ctx.Barrier(n + 1), ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(daemon.socket, i, rounds, barrier, results))
             for i in range(n)]
    for p in procs:
        p.start()
    db = sqlite3.connect(f"file:{daemon.db}?mode=ro", uri=True)
    try:
        with SyncClient(daemon.socket, timeout=30) as admin:
            for rnd in range(rounds):
                job = admin.enqueue(kind="k", required_role="cpu", priority=3,
                                    payload={"round": rnd}).job_id
                barrier.wait(ROUND_TIMEOUT_S)       # all 16 claim at the same instant
                barrier.wait(ROUND_TIMEOUT_S)
                got = [results.get(timeout=ROUND_TIMEOUT_S) for _ in range(n)]
                assert {g[0] for g in got} == {rnd}
                outcomes = [g[2] for g in got]
                assert not [o for o in outcomes if o and o.startswith("ERROR")], outcomes
                assert outcomes.count(job) == 1 and outcomes.count(None) == n - 1, outcomes
                view = admin.get_job(job)
                assert view.status == "running" and view.attempts == 1
                assert db.execute("SELECT count(*) FROM leases WHERE job_id = ?",
                                  (job,)).fetchone()[0] == 1
            assert admin.status().active_leases == rounds
    finally:
        db.close()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    assert LOCKED not in daemon.log()


# ---------------------------------------------------------------- B02


def _enqueuer(sock: str, count: int, out) -> None:
    """The CLI's tight enqueue loop, in its own process; reports ids and errors."""
    ids, errs = [], []
    with SyncClient(sock, timeout=30) as c:
        for i in range(count):
            try:
                ids.append(c.enqueue(kind="k", required_role="cpu", priority=2,
                                     payload={"live": i}).job_id)
            except Exception as exc:
                errs.append(f"{type(exc).__name__}: {exc}")
    out.put((ids, errs))


async def _b02(daemon_factory, tmp_path, pre: int, live: int) -> None:
    d = daemon_factory("reaper_interval_s = 1.0\n")  # the reaper runs every second
    d.start()
    total = pre + live
    problems: list[str] = []
    completed: list[str] = []
    claim_latency: list[float] = []
    done = asyncio.Event()
    async with Client(d.socket, timeout=30) as admin:
        pre_ids = []
        for start in range(0, pre, 500):
            batch = await admin.enqueue_batch(
                [{"kind": "k", "required_role": "cpu", "priority": 2, "payload": {"pre": i}}
                 for i in range(start, min(pre, start + 500))])
            pre_ids += [j.job_id for j in batch.jobs]
        ctx = _spawn()
        out = ctx.Queue()
        cli = ctx.Process(target=_enqueuer, args=(d.socket, live, out))
        cli.start()

        async def worker(idx: int) -> None:
            name = f"w{idx}"
            async with Client(d.socket, timeout=30) as c:
                await c.heartbeat(name, ["cpu"], COOL)
                n = 0
                while not done.is_set():
                    t0 = time.perf_counter()
                    res = await c.claim(name, lease_s=30)
                    claim_latency.append(time.perf_counter() - t0)
                    if res.job is None:
                        if "heartbeat_stale" in res.reasons:
                            problems.append(f"{name}: {res.detail}")
                        await asyncio.sleep(0.005)
                        continue
                    for _ in range(3):
                        await c.renew(res.job.job_id, name, res.lease.token, 30)
                    await c.complete(res.job.job_id, name, res.lease.token, {"by": name})
                    completed.append(res.job.job_id)
                    if len(completed) >= total:
                        done.set()
                    n += 1
                    if n % 50 == 0:
                        await c.heartbeat(name, ["cpu"], COOL)

        async def poller() -> None:
            async with Client(d.socket, timeout=30) as c:
                backed_up = False
                while not done.is_set():
                    st = await c.status()
                    if not backed_up and st.jobs["succeeded"] > total // 2:
                        await c.backup(str(tmp_path / "mid.db"))  # a reader beside it all
                        backed_up = True
                    await asyncio.sleep(0.2)

        async def guarded(coro) -> None:
            try:
                await coro
            except Exception as exc:
                problems.append(f"{type(exc).__name__}: {exc}")
                done.set()

        await asyncio.wait_for(asyncio.gather(*(guarded(worker(i)) for i in range(8)),
                                              guarded(poller())), timeout=600)
        live_ids, cli_errors = await asyncio.get_running_loop().run_in_executor(
            None, out.get, True, 60)
        cli.join(30)
        final = await admin.status()
    assert problems == [] and cli_errors == []
    assert len(completed) == len(set(completed)) == total
    assert set(completed) == set(pre_ids) | set(live_ids)
    assert final.jobs["succeeded"] == total and final.jobs["waiting"] == 0
    assert final.active_leases == 0
    claim_latency.sort()
    assert claim_latency[int(len(claim_latency) * 0.99)] < 1.0
    assert LOCKED not in d.log()


async def test_b02_no_busy_under_claims_enqueues_reaps_and_polls(daemon_factory, tmp_path):
    await _b02(daemon_factory, tmp_path, pre=300, live=300)


@pytest.mark.slow
async def test_b02_no_busy_full_size(daemon_factory, tmp_path):
    await _b02(daemon_factory, tmp_path, pre=2000, live=2000)


# ---------------------------------------------------------------- B34


async def test_b34_cli_reap_with_other_clock_settings_goes_through_the_daemon(daemon_factory):
    d = daemon_factory()
    d.env = {"TZ": "Australia/Lord_Howe"}  # a zone with a half-hour DST step
    d.start()
    async with Client(d.socket, timeout=10) as c:
        job = (await c.enqueue(kind="k", required_role="cpu", priority=1)).job_id
        await c.heartbeat("w1", ["cpu"], COOL)
        got = await c.claim("w1", lease_s=30)
        fast = time.time() + 600                   # what a clock 10 min fast would send
        assert (await c.call("reap", {"now": fast}))["reaped"] == 0
        for tz in ("America/New_York", "UTC"):
            run = subprocess.run(
                [sys.executable, "-m", "coordctl", "--socket", d.socket, "--json", "reap"],
                capture_output=True, text=True, timeout=30, env={**os.environ, "TZ": tz})
            assert run.returncode == 0, run.stderr
        await c.heartbeat("w2", ["cpu"], {**COOL, "now": fast})
        res = await c.call("claim", {"worker_id": "w2", "lease_s": 30, "now": fast,
                                     "expires_at": fast})
        assert res["job"] is None
        view = await c.get_job(job)
        assert view.status == "running" and view.lease.worker_id == "w1"
        assert view.lease.expires_at == got.lease.expires_at
        with pytest.raises(errors.LeaseLost):
            await c.complete(job, "w2", got.lease.token + 1, {"stolen": True})
        assert (await c.call("prune", {}))["pruned"] == 0  # admin RPC, coordd's clock
