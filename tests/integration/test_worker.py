"""Whole-process tests of coord-worker: a real coordd, real worker processes, real model trees.

Model processes are small scripts configured as kinds in a worker TOML, plus the real `train`
model. Leases, grace periods and reaper intervals are kept short so the file stays quick.
The tests over `store_bench` run on both stores (SQLite, then a fresh PostgreSQL database);
`bench` is SQLite's, for what no store decides (the in-process supervisor's cancel) and for
the other files that import it.
"""

from __future__ import annotations
import asyncio
import json
from datetime import datetime
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from coordd.client import Client
from worker.config import from_dict
from worker.supervisor import Supervisor

from tests.integration.workerbench import (  # noqa: F401 (the fixtures)
    COOL, alive, bench, store_bench,
)


async def test_end_to_end_batch_runs_once_and_p0_first(store_bench):
    bench = store_bench
    low = [await bench.enqueue({"echo": i}, priority=3) for i in range(4)]
    high = [await bench.enqueue({"echo": 10 + i}, priority=0) for i in range(2)]
    big = await bench.enqueue({"echo": "big", "pad": 400}, priority=2)
    w = bench.start_worker(inline_result_bytes=300)
    views = [await bench.status_is(j, "succeeded", "failed") for j in [*high, big, *low]]
    assert [v.status for v in views] == ["succeeded"] * 7, w.log()
    for v in views:
        assert v.attempts == 1
        assert [e.to_status for e in v.events].count("succeeded") == 1
    for v in views[:2] + views[3:]:
        assert v.result["worker"] == "w1" and v.artifact is None
    assert [v.result["echo"] for v in views[:2] + views[3:]] == [10, 11, 0, 1, 2, 3]
    assert max(v.finished_at for v in views[:2]) < min(v.finished_at for v in views[2:])
    # over inline_result_bytes: the file is in the artifact store, the DB keeps a reference
    art = views[2].artifact
    assert art is not None and views[2].result == {"artifact": art.sha256, "bytes": art.size}
    data = await bench.daemon.artifact_bytes(art.sha256)
    assert len(data) == art.size and json.loads(data)["pad"] == "x" * 400
    if bench.daemon.store is None:  # a file beside the database, named by its sha256
        assert Path(art.path).read_bytes() == data
        assert Path(art.path).name == art.sha256 and Path(art.path).parent.name == art.sha256[:2]
    else:  # rows of the database
        assert art.path == "postgresql:" + art.sha256
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(10) == 0


async def test_b10_b16_kill9_worker_midjob_resumes_from_checkpoint(store_bench):
    bench = store_bench
    payload = {"steps": 40, "checkpoint_every": 5, "seed": 7}
    ref_dir = bench.tmp / "ref"
    (ref_dir / "ckpt").mkdir(parents=True)
    (ref_dir / "payload.json").write_text(json.dumps(payload))
    done = subprocess.run(
        [sys.executable, "-m", "worker.models.train", "--payload", str(ref_dir / "payload.json"),
         "--result", str(ref_dir / "result.json"), "--checkpoint-dir", str(ref_dir / "ckpt"),
         "--resume-from", ""], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    reference = json.loads((ref_dir / "result.json").read_text())

    train = {"train": {"argv": [sys.executable, "-m", "worker.models.train", "--payload", "{payload}",
                                "--result", "{result}", "--checkpoint-dir", "{checkpoint_dir}",
                                "--resume-from", "{resume_from}"]}}
    job = await bench.enqueue({**payload, "step_delay_s": 0.15}, kind="train", priority=3,
                              max_attempts=3)
    a = bench.start_worker("A", extra_kinds=train)

    async def checkpointed() -> Any:
        view = await bench.client.get_job(job)
        return view if view.checkpoint else None
    view = await bench.until(checkpointed, what="a checkpoint recorded")
    assert view.status == "running" and view.lease.worker_id == "A"
    ckpt = view.checkpoint
    assert ckpt["name"].startswith("ckpt-")
    assert len(await bench.daemon.artifact_bytes(ckpt["sha256"])) == ckpt["size"]
    if bench.daemon.store is None:
        assert Path(ckpt["path"]).is_file() and Path(ckpt["path"]).name == ckpt["sha256"]
    else:
        assert ckpt["path"] == "postgresql:" + ckpt["sha256"]

    # a power cut: the supervisor and the model's whole group, SIGKILL, no goodbye
    models = a.descendants()
    assert models, a.log()
    a.proc.kill()
    for m in models:
        try:
            os.killpg(m.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    a.proc.wait(5)

    back = await bench.status_is(job, "waiting", timeout=10)  # lease (2 s) + reaper, not hours
    assert back.attempts == 1 and "lease_expired" in (back.last_error or "")
    b = bench.start_worker("B", extra_kinds=train)
    final = await bench.status_is(job, "succeeded", "failed", timeout=40)
    assert final.status == "succeeded", (final.last_error, b.log())
    assert final.attempts == 2
    assert [e.to_status for e in final.events].count("succeeded") == 1
    assert final.result["resumed_from_step"] > 0
    assert final.result["model_sha256"] == reference["model_sha256"]


async def test_b25_cancel_kills_tree_within_grace(store_bench):
    bench = store_bench
    w = bench.start_worker(kind={}, grace_s=1)
    job = await bench.enqueue({"sleep": 60, "child": True})
    pids = await bench.model_pids(job, "w1")
    assert len(alive(pids)) == 2
    t0 = time.monotonic()
    assert (await bench.client.cancel(job)).status == "running"  # cancel requested
    final = await bench.status_is(job, "cancelled", timeout=10)
    gone_after = time.monotonic() - t0
    assert alive(pids) == [], w.log()
    # renew every lease/3 (0.67 s) or a heartbeat (0.5 s) tells the worker; then 1 s of grace
    assert gone_after < 0.7 + 1.0 + 2.0
    assert final.result is None and final.artifact is None


async def test_b25_cancelling_supervisor_task_kills_tree(bench):
    cfg = from_dict({"lease_s": 2, "heartbeat_interval_s": 0.5, "grace_s": 0.5, "stop_timeout_s": 5,
                     "claim_interval_s": 0.1, "work_dir": str(bench.tmp / "work-inproc"),
                     "kinds": {"m": {"argv": [sys.executable, str(bench.tmp / "model.py")],
                                     "env": {"PIDDIR": str(bench.piddir)}}}})
    sup = Supervisor(lambda: Client(bench.daemon.socket, timeout=5), "inproc", ["cpu"], cfg,
                     override_path=str(bench.tmp / "readings.json"))
    task = asyncio.create_task(sup.run())
    job = await bench.enqueue({"sleep": 60, "child": True})
    pids = await bench.model_pids(job, "inproc")
    assert sup.running_jobs == [job]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert alive(pids) == []


async def test_exit_75_retried_with_backoff_exit_1_failed_at_once(store_bench):
    bench = store_bench
    w = bench.start_worker()
    counter = bench.tmp / "counter"
    flaky = await bench.enqueue({"counter": str(counter), "fail_times": 1, "echo": "ok"},
                                max_attempts=3)
    always = await bench.enqueue({"exit": 75, "stderr": "try later"}, max_attempts=2)
    broken = await bench.enqueue({"exit": 1, "stderr": "boom: bad weights\n"})

    v = await bench.status_is(flaky, "succeeded", "failed")
    assert v.status == "succeeded" and v.attempts == 2 and v.result["echo"] == "ok", w.log()
    retry = [e for e in v.events if e.from_status == "running" and e.to_status == "waiting"]
    assert len(retry) == 1 and "retryable: exit 75" in retry[0].reason
    backoff_until = datetime.fromisoformat(  # ISO-8601 UTC, as every time coordd prints
        retry[0].reason.rsplit("backoff until ", 1)[1].replace("Z", "+00:00")).timestamp()
    assert backoff_until > retry[0].at - 1  # (whole seconds: the test's backoff is shorter)
    rerun = [e for e in v.events if e.to_status == "running"][1]
    assert rerun.at >= backoff_until

    v = await bench.status_is(always, "failed")
    assert v.attempts == 2 and "attempts exhausted" in v.last_error and "try later" in v.last_error

    v = await bench.status_is(broken, "failed")
    assert v.attempts == 1
    assert v.last_error.startswith("permanent: exit 1") and "boom: bad weights" in v.last_error


async def test_b17_timeout_kills_sigterm_trapping_model(bench):
    """SQLite only: the kind's timeout is the worker's (the store sees a retryable fail,
    as test_exit_75_retried_with_backoff_exit_1_failed_at_once on both)."""
    w = bench.start_worker(kind={"timeout_s": 1}, grace_s=0.5)
    job = await bench.enqueue({"sleep": 60, "trap_term": True, "child": True}, max_attempts=1)
    pids = await bench.model_pids(job, "w1")
    t0 = time.monotonic()
    final = await bench.status_is(job, "failed", "waiting", timeout=10)
    assert time.monotonic() - t0 < 1 + 0.5 + 3
    assert "timeout after 1s" in final.last_error, w.log()
    assert alive(pids) == []


async def test_b19_sigterm_supervisor_hands_job_back(store_bench):
    bench = store_bench
    w = bench.start_worker(lease_s=30, grace_s=0.5)
    job = await bench.enqueue({"sleep": 60, "child": True})
    pids = await bench.model_pids(job, "w1")
    t0 = time.monotonic()
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(10) == 0
    assert time.monotonic() - t0 < 5  # stop_timeout_s
    view = await bench.client.get_job(job)  # at once, not after the 30 s lease
    assert view.status == "waiting" and view.lease is None, w.log()
    assert view.last_error == "released: worker_shutdown"
    assert view.attempts == 0 and view.preemptions == 1  # a stop is not the job's failure
    assert alive(pids) == []


async def test_b07_frozen_supervisor_loses_lease_and_kills_model(store_bench):
    bench = store_bench
    # A's model would run for a minute; B's finishes quickly
    a = bench.start_worker("A")
    job = await bench.enqueue({"sleep": {"A": 60, "B": 0.5}, "child": True}, max_attempts=3)
    pids = await bench.model_pids(job, "A")
    a.proc.send_signal(signal.SIGSTOP)  # the model keeps running
    try:
        await bench.status_is(job, "waiting", timeout=10)  # lease (2 s) expired and reaped
        assert alive(pids) == pids
        b = bench.start_worker("B")
        await bench.model_pids(job, "B")
    finally:
        a.proc.send_signal(signal.SIGCONT)
    t0 = time.monotonic()

    async def a_tree_gone() -> bool:
        return not alive(pids)
    await bench.until(a_tree_gone, timeout=10, what="A's model tree gone")
    assert time.monotonic() - t0 < 5
    final = await bench.status_is(job, "succeeded", "failed")
    assert final.status == "succeeded" and final.result["worker"] == "B", (a.log(), b.log())
    assert final.attempts == 2
    done = [e for e in final.events if e.to_status == "succeeded"]
    assert len(done) == 1 and done[0].worker_id == "B"
    await asyncio.sleep(0.5)
    assert "lease lost" in a.log() and f"job {job}: succeeded" not in a.log()
    assert a.proc.poll() is None  # A lives on and keeps serving


async def test_gate_refusal_end_to_end(store_bench):
    bench = store_bench
    hot = bench.tmp / "hot.json"
    hot.write_text(json.dumps({**COOL, "memory_used_pct": 90.0}))
    job = await bench.enqueue({"echo": 1}, priority=0)
    w = bench.start_worker(readings=hot)

    async def refused() -> Any:
        workers = (await bench.client.workers()).workers
        return workers[0] if workers else None
    seen = await bench.until(refused, what="worker heartbeat")
    assert seen.worker_id == "w1" and "memory_high" in seen.verdicts["p0"]
    assert seen.readings["memory_used_pct"] == 90.0
    await asyncio.sleep(1.0)  # several claim rounds
    assert (await bench.client.get_job(job)).status == "waiting"
    assert "claimed" not in w.log()
    hot.write_text(json.dumps(COOL))  # re-read on every heartbeat
    assert (await bench.status_is(job, "succeeded")).result["worker"] == "w1"
