"""Governance of running work through a real coordd and coord-worker with real signals
(issue 16, item 1), on both stores: readings come through `--readings-override`, the model
is a small deterministic counter that checkpoints on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from coordd.client import Client
from tests.integration.workerbench import (
    COOL, Bench, WorkerProc, alive, stop_workers, worker_toml,
)

HEARTBEAT_S = 0.5
ACTIVE = {**COOL, "user_idle_s": 1.0}

# steps `steps` times, `dt` seconds apart; each step appends to `progress`; every 10 steps
# the state goes to a whole checkpoint file (temp name, rename); SIGTERM exits 75. The result
# depends only on `steps`, so a suspended or resumed run must end as an uninterrupted one.
COUNTER = textwrap.dedent("""
    import json, os, signal, sys, time
    d, resume = os.environ["COORD_CHECKPOINT_DIR"], os.environ["COORD_RESUME_FROM"]
    p = json.load(open(os.environ["COORD_PAYLOAD"]))
    state = json.load(open(resume)) if resume else {"step": 0, "acc": 1}
    open(p["pidfile"], "w").write(str(os.getpid()))
    def save(st):
        tmp = os.path.join(d, ".ckpt.tmp")
        with open(tmp, "w") as fh:
            json.dump(st, fh)
        os.replace(tmp, os.path.join(d, "ckpt-%d" % st["step"]))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
    while state["step"] < p["steps"]:
        s = state["step"] + 1
        state = {"step": s, "acc": (state["acc"] * 31 + s) % 1000003}
        if s % 10 == 0:
            save(state)
        with open(p["progress"], "a") as fh:
            fh.write("%d\\n" % s)
        time.sleep(p.get("dt", 0.02))
    with open(os.environ["COORD_RESULT"], "w") as fh:
        json.dump({"acc": state["acc"], "resumed": bool(resume)}, fh)
""")


def expected_acc(steps: int) -> int:
    acc = 1
    for s in range(1, steps + 1):
        acc = (acc * 31 + s) % 1000003
    return acc


def daemon_toml(preempt_min_runtime_s: float = 30.0, **p3: Any) -> str:
    gates = "\n".join(f"{k} = {json.dumps(v)}" for k, v in p3.items())
    return ("reaper_interval_s = 0.3\nheartbeat_stale_s = 5\n"
            f"preempt_min_runtime_s = {preempt_min_runtime_s}\n[gates.p3]\n{gates}\n")


# a rule that is the worker's alone runs on SQLite only (the store's parameter narrowed)
SQLITE_ONLY = pytest.mark.parametrize("store_daemon_factory", ["sqlite"], indirect=True)


@pytest.fixture
async def gov(store_daemon_factory, tmp_path):
    """Factory: a coordd with `[gates.p3]` settings over each store in turn
    (tests/integration/conftest.py), a client and a worker starter."""
    started: list[WorkerProc] = []
    clients: list[Client] = []
    model = tmp_path / "counter.py"
    model.write_text(COUNTER)
    readings = tmp_path / "readings.json"
    readings.write_text(json.dumps(COOL))

    async def make(**p3: Any) -> tuple[Bench, Any]:
        daemon = store_daemon_factory(daemon_toml(**p3))
        daemon.start()
        client = Client(daemon.socket, timeout=10)
        await client.__aenter__()
        clients.append(client)

        def start_worker(worker_id: str = "w1", kind: dict[str, Any] | None = None,
                         extra_kinds: dict[str, dict[str, Any]] | None = None,
                         **settings: Any) -> WorkerProc:
            kinds = {"count": {"argv": [sys.executable, str(model)], "slots": 1, **(kind or {})},
                     **(extra_kinds or {})}
            work_dir = tmp_path / f"work-{worker_id}"
            cfg = tmp_path / f"{worker_id}.toml"
            cfg.write_text(worker_toml(work_dir, kinds, **{"heartbeat_interval_s": HEARTBEAT_S,
                                                           **settings}))
            log_path = tmp_path / f"{worker_id}.log"
            import subprocess
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "worker", "--worker-id", worker_id, "--roles", "cpu",
                     "--socket", daemon.socket, "--config", str(cfg),
                     "--readings-override", str(readings)], stdout=log, stderr=log)
            w = WorkerProc(worker_id, proc, log_path, work_dir)
            started.append(w)
            return w
        return Bench(tmp_path, daemon, client, tmp_path, start_worker), readings

    yield make
    stop_workers(started)
    for c in clients:
        await c.__aexit__(None, None, None)


def steps_done(progress: Path) -> int:
    return len(progress.read_text().split()) if progress.exists() else 0


def state_of(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"


async def wait_for(check, timeout: float, what: str) -> float:
    """Poll `check()` until true; return the seconds it took."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


async def enqueue_counter(bench: Bench, steps: int, dt: float = 0.02) -> tuple[str, Path, Path]:
    progress, pidfile = bench.tmp / "progress", bench.tmp / "model.pid"
    job = await bench.enqueue({"steps": steps, "dt": dt, "progress": str(progress),
                               "pidfile": str(pidfile)}, kind="count", priority=3,
                              max_attempts=3)
    return job, progress, pidfile


async def test_p3_model_is_stopped_when_the_user_returns_and_continues_when_idle(gov):
    bench, readings = await gov(resume_after_s=0.5, max_suspend_s=60)
    job, progress, pidfile = await enqueue_counter(bench, steps=80)
    w = bench.start_worker()
    await wait_for(lambda: steps_done(progress) >= 10, 15, "the model running")
    pid = int(pidfile.read_text())
    readings.write_text(json.dumps(ACTIVE))
    took = await wait_for(lambda: state_of(pid) == psutil.STATUS_STOPPED, HEARTBEAT_S + 1.0,
                          "process state T")
    frozen = steps_done(progress)
    await asyncio.sleep(1.0)  # no progress while stopped
    assert steps_done(progress) <= frozen + 1 and state_of(pid) == psutil.STATUS_STOPPED
    view = await bench.client.get_job(job)
    assert view.status == "running" and view.lease.governance.suspend_reason == "user_active"
    workers = (await bench.client.call("workers", {}))["workers"]
    assert [x["worker_id"] for x in workers] == ["w1"] and workers[0]["live"]
    assert workers[0]["readings"]["user_idle_s"] == ACTIVE["user_idle_s"]
    assert workers[0]["verdicts"]["p3"] == ["user_active"]
    assert any(n.startswith(f"governance: {job} suspended since") for n in workers[0]["notes"])
    readings.write_text(json.dumps(COOL))
    await wait_for(lambda: state_of(pid) not in (psutil.STATUS_STOPPED, "gone")
                   and steps_done(progress) > frozen + 2, HEARTBEAT_S * 2 + 0.5 + 1.5,
                   "the model continuing")
    final = await bench.status_is(job, "succeeded", "failed", timeout=20)
    assert final.status == "succeeded", (final.last_error, w.log())
    assert final.result == {"acc": expected_acc(80), "resumed": False}
    assert final.attempts == 1 and final.preemptions == 0
    reasons = [e.reason or "" for e in final.events]
    assert any(r.startswith("suspended: user_active") for r in reasons), reasons
    assert any(r.startswith("resumed:") for r in reasons), reasons
    assert took <= HEARTBEAT_S + 1.0
    # an orderly stop ends with a delivered goodbye: `workers` shows it offline at once
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(15) == 0, w.log()
    assert "goodbye not delivered" not in w.log(), w.log()
    await wait_for(lambda: "worker w1 said goodbye" in bench.daemon.log(), 5, "the goodbye")
    gone = (await bench.client.call("workers", {}))["workers"][0]
    assert gone["offline_at"] is not None and not gone["live"]
    assert (await bench.client.status()).workers_live == 0
    metrics = (await bench.client.call("metrics", {}))["text"]
    assert 'coordd_governance_actions_total{action="suspend",reason="user_active"}' in metrics


async def test_suspended_past_max_suspend_s_is_vacated_and_resumes_from_its_checkpoint(gov):
    """The user returns only once a checkpoint is recorded: a file is taken once it held
    still for SETTLE_S while the model ran (worker.checkpoints), so a vacate sooner than
    that after ckpt-10 was written may rightly leave nothing to resume from."""
    bench, readings = await gov(resume_after_s=0.3, max_suspend_s=1.0)
    job, progress, pidfile = await enqueue_counter(bench, steps=300)
    w = bench.start_worker()

    async def checkpointed() -> Any:
        return (await bench.client.get_job(job)).checkpoint
    await bench.until(checkpointed, what="a checkpoint of the run recorded")
    assert steps_done(progress) < 300, "the model ended before its user returned"
    pid = int(pidfile.read_text())
    readings.write_text(json.dumps(ACTIVE))
    await wait_for(lambda: state_of(pid) == psutil.STATUS_STOPPED, HEARTBEAT_S + 1.0,
                   "process state T")
    back = await bench.status_is(job, "waiting", timeout=10)
    assert state_of(pid) == "gone"
    assert back.attempts == 0 and back.preemptions == 1, back  # no attempt spent
    assert "vacated: max_suspend_s" in (back.last_error or ""), back.last_error
    stopped_at = back.checkpoint["name"]
    assert stopped_at.startswith("ckpt-") and int(stopped_at[5:]) >= 10
    readings.write_text(json.dumps(COOL))  # idle again: claimed again, resumed from it
    final = await bench.status_is(job, "succeeded", "failed", timeout=20)
    assert final.status == "succeeded", (final.last_error, w.log())
    assert final.result == {"acc": expected_acc(300), "resumed": True}
    assert final.attempts == 1 and final.preemptions == 1


@SQLITE_ONLY
async def test_supervisor_killed_while_suspended_leaves_no_stopped_process(gov):
    """SQLite only: the stopped model's end is the worker's (lease expiry and the reaper
    run on both stores in test_worker's b07 and b10)."""
    bench, readings = await gov(resume_after_s=0.3, max_suspend_s=60)
    job, progress, pidfile = await enqueue_counter(bench, steps=60)
    a = bench.start_worker("A")
    await wait_for(lambda: steps_done(progress) >= 5, 15, "the model running")
    pid = int(pidfile.read_text())
    readings.write_text(json.dumps(ACTIVE))
    await wait_for(lambda: state_of(pid) == psutil.STATUS_STOPPED, HEARTBEAT_S + 1.0,
                   "process state T")
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(10)
    await wait_for(lambda: not alive([pid]), 5, "the stopped model gone")
    readings.write_text(json.dumps(COOL))
    await bench.status_is(job, "waiting", timeout=10)  # the lease expired, reaped
    b = bench.start_worker("B")
    final = await bench.status_is(job, "succeeded", "failed", timeout=20)
    assert final.status == "succeeded", (final.last_error, b.log())
    assert final.result["acc"] == expected_acc(60)
    assert [e.to_status for e in final.events].count("succeeded") == 1
    assert final.attempts == 2  # the lost run spent its attempt (worker_lost)


@pytest.mark.parametrize("other_kind", [False, True], ids=["one_kind", "kind_full_slots_free"])
async def test_p0_on_a_one_slot_worker_busy_with_p3_starts_within_grace_plus_1s(gov, other_kind):
    """Also with a free slot of another kind: the worker must not claim the P0 job of its
    full kind and hold it (coordd would call it running and never preempt)."""
    bench, _ = await gov(preempt_min_runtime_s=0.0)
    job, progress, pidfile = await enqueue_counter(bench, steps=200, dt=0.01)
    grace_s = 0.5
    other = {"other": {"argv": [sys.executable, "-c", "pass"], "slots": 1}}
    w = bench.start_worker(grace_s=grace_s, extra_kinds=other if other_kind else None)

    async def checkpointed() -> Any:
        return (await bench.client.get_job(job)).checkpoint
    await bench.until(checkpointed, what="a checkpoint of the P3 run recorded")
    p3_pid = int(pidfile.read_text())
    p0_pid = bench.tmp / "p0.pid"
    p0 = await bench.enqueue({"steps": 3, "progress": str(bench.tmp / "p0.progress"),
                              "pidfile": str(p0_pid)}, kind="count", priority=0)
    took = await wait_for(p0_pid.exists, grace_s + 1.0 + 2.0, "the P0 model started")
    assert took <= grace_s + 1.0, (took, w.log())
    assert state_of(p3_pid) == "gone"
    done = await bench.status_is(p0, "succeeded", timeout=10)
    assert done.attempts == 1
    final = await bench.status_is(job, "succeeded", "failed", timeout=20)
    assert final.status == "succeeded", (final.last_error, w.log())
    assert final.result == {"acc": expected_acc(200), "resumed": True}
    assert final.attempts == 1 and final.preemptions == 1  # the vacate spent no attempt
    reasons = [e.reason or "" for e in final.events]
    assert any(r.startswith(f"vacate: preempted_by {p0}") for r in reasons), reasons
    # the P3 job was claimed again only after the P0 job ended: nothing took its slot
    again = [e.at for e in final.events if (e.reason or "").startswith("claimed")][1]
    assert again >= max(e.at for e in done.events if e.to_status == "succeeded")


@SQLITE_ONLY
async def test_time_spent_suspended_does_not_count_toward_the_kinds_timeout(gov):
    """SQLite only: the kind's timeout is the worker's clock."""
    bench, readings = await gov(resume_after_s=0.2, max_suspend_s=60)
    job, progress, pidfile = await enqueue_counter(bench, steps=50)  # ~1 s of running
    w = bench.start_worker(kind={"timeout_s": 2.5})
    await wait_for(lambda: steps_done(progress) >= 5, 15, "the model running")
    pid = int(pidfile.read_text())
    readings.write_text(json.dumps(ACTIVE))
    await wait_for(lambda: state_of(pid) == psutil.STATUS_STOPPED, HEARTBEAT_S + 1.0,
                   "process state T")
    await asyncio.sleep(2.5)  # stopped past the whole timeout
    readings.write_text(json.dumps(COOL))
    final = await bench.status_is(job, "succeeded", "failed", "waiting", timeout=20)
    assert final.status == "succeeded", (final.last_error, w.log())
    assert final.attempts == 1 and final.result["acc"] == expected_acc(50)
