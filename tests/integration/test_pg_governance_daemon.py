"""Governance of running work on coordd --store postgresql://, as processes: a real coordd
on the throwaway cluster and a real coord-worker whose readings come through
`--readings-override`; the model is tests/integration/test_governance_worker's counter.
Skipped, with the reason, without asyncpg or the PostgreSQL binaries.

The default run's cases (suspend and resume, the goodbye, `workers`, metrics, vacate past
max_suspend_s, preemption) are tests/integration/test_governance_worker's, on both stores;
this file keeps the long vacate drill with coordctl `workers` and `top` (`-m slow`)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from coordd.client import Client
from tests.integration.test_coordctl import ctl, ok, ok_json
from tests.integration.test_governance_worker import (
    ACTIVE, COUNTER, HEARTBEAT_S, expected_acc, state_of, steps_done, wait_for,
)
from tests.integration.test_pg_daemon import Coordd, pg_db  # noqa: F401 (a fixture)
from tests.integration.workerbench import COOL, WorkerProc, stop_workers, until, worker_toml

DAEMON_CFG = """
reaper_interval_s = 0.3
heartbeat_stale_s = 5
[gates.p3]
resume_after_s = 0.3
max_suspend_s = 2.5
"""


@pytest.fixture
def rig(pg_db: str, tmp_path: Path) -> Any:  # noqa: F811
    """(coordd serving, readings file, start_worker(), tmp_path); stopped after."""
    cfg = tmp_path / "coordd.toml"
    cfg.write_text(DAEMON_CFG)
    d = Coordd(pg_db, str(tmp_path / "coordd.sock"), str(cfg), tmp_path / "coordd.log")
    readings = tmp_path / "readings.json"
    readings.write_text(json.dumps(COOL))
    model = tmp_path / "counter.py"
    model.write_text(COUNTER)
    workers: list[WorkerProc] = []

    def start_worker(worker_id: str = "w1") -> WorkerProc:
        import subprocess
        work_dir = tmp_path / f"work-{worker_id}"
        wcfg = tmp_path / f"{worker_id}.toml"
        wcfg.write_text(worker_toml(work_dir, {"count": {"argv": [sys.executable, str(model)],
                                                         "slots": 1}},
                                    heartbeat_interval_s=HEARTBEAT_S))
        log_path = tmp_path / f"{worker_id}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "worker", "--worker-id", worker_id, "--roles", "cpu",
                 "--socket", d.socket, "--config", str(wcfg), "--readings-override",
                 str(readings)], stdout=log, stderr=log)
        w = WorkerProc(worker_id, proc, log_path, work_dir)
        workers.append(w)
        return w
    d.start()
    yield d, readings, start_worker, tmp_path
    stop_workers(workers)
    d.stop()


async def _status(c: Client, job_id: str, *statuses: str, timeout: float = 20.0) -> Any:
    async def check() -> Any:
        job = await c.get_job(job_id)
        return job if job.status in statuses else None
    return await until(check, timeout, f"job {job_id} {'/'.join(statuses)}")


async def _suspend_and_resume(c: Client, readings: Path, start_worker: Any, tmp: Path,
                              steps: int) -> tuple[str, WorkerProc, Path]:
    """Run the counter on w1; the user comes back: SIGSTOP (shown by get_job and
    `workers`); idle again: SIGCONT. Returns (job id, worker, progress file)."""
    progress, pidfile = tmp / "progress", tmp / "model.pid"
    job = (await c.enqueue(kind="count", required_role="cpu", priority=3, max_attempts=3,
                           payload={"steps": steps, "dt": 0.02, "progress": str(progress),
                                    "pidfile": str(pidfile)})).job_id
    w = start_worker()
    await wait_for(lambda: steps_done(progress) >= 10, 20, "the model running")
    pid = int(pidfile.read_text())
    readings.write_text(json.dumps(ACTIVE))
    await wait_for(lambda: state_of(pid) == psutil.STATUS_STOPPED, HEARTBEAT_S * 2 + 1,
                   "process state T")
    view = await c.get_job(job)
    assert view.status == "running" and view.lease.governance.suspend_reason == "user_active"
    workers = (await c.call("workers", {}))["workers"]
    assert [x["worker_id"] for x in workers] == ["w1"] and workers[0]["live"]
    assert workers[0]["readings"]["user_idle_s"] == ACTIVE["user_idle_s"]
    assert workers[0]["verdicts"]["p3"] == ["user_active"]
    assert any(n.startswith(f"governance: {job} suspended since") for n in workers[0]["notes"])
    frozen = steps_done(progress)
    readings.write_text(json.dumps(COOL))
    await wait_for(lambda: state_of(pid) not in (psutil.STATUS_STOPPED, "gone")
                   and steps_done(progress) > frozen + 2, HEARTBEAT_S * 3 + 1.5,
                   "the model continuing")
    return job, w, progress


async def _stop(d: Coordd, w: WorkerProc) -> None:
    """SIGTERM the worker: an orderly stop ends with a delivered goodbye."""
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(15) == 0, w.log()
    assert "goodbye not delivered" not in w.log(), w.log()
    await until(lambda: _async("worker w1 said goodbye" in d.log()), 5, "the goodbye logged")


async def _async(value: Any) -> Any:
    return value


@pytest.mark.slow
async def test_a_worker_on_postgres_is_vacated_past_max_suspend_s_and_resumes(rig):
    """Suspended longer than max_suspend_s: vacated (no attempt spent), claimed again and
    resumed from its checkpoint; coordctl workers and top on the PostgreSQL coordd."""
    d, readings, start_worker, tmp = rig
    await d.wait_serving()
    async with Client(d.socket, timeout=10) as c:
        job, w, _ = await _suspend_and_resume(c, readings, start_worker, tmp, steps=100)
        readings.write_text(json.dumps(ACTIVE))  # back, for longer than max_suspend_s
        back = await _status(c, job, "waiting")
        assert back.attempts == 0 and back.preemptions == 1, back
        assert "vacated: max_suspend_s" in (back.last_error or ""), back.last_error
        readings.write_text(json.dumps(COOL))
        final = await _status(c, job, "succeeded", "failed", timeout=30)
        assert final.status == "succeeded", (final.last_error, w.log())
        assert final.result == {"acc": expected_acc(100), "resumed": True}
        assert final.attempts == 1 and final.preemptions == 1
        reasons = [e.reason or "" for e in final.events]
        for text in ("suspended: user_active", "resumed:", "vacate: max_suspend_s"):
            assert any(r.startswith(text) for r in reasons), reasons
        await _stop(d, w)
        gone = ok_json(ctl(d.socket, "--json", "workers"))["workers"][0]  # coordctl workers
        assert gone["offline_at"] is not None and not gone["live"]
        assert "workers 1 (0 live)" in ok(ctl(d.socket, "top", "--once"))  # coordctl top
