"""GPU and RAM admission through a real coordd and real coord-worker processes (issue 16,
item 3). The worker reads its GPU through NVML as in production, but the `pynvml` it
imports is tests/fake_nvml (on PYTHONPATH), whose GPUs a JSON file sets: no GPU here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from coordd.client import Client
from tests.integration.workerbench import COOL, WorkerProc, stop_workers

FAKE_NVML = Path(__file__).resolve().parents[1] / "fake_nvml"

# records [start, end] and CUDA_VISIBLE_DEVICES; sleeps `dt` seconds
MODEL = textwrap.dedent("""
    import json, os, time
    p = json.load(open(os.environ["COORD_PAYLOAD"]))
    t0 = time.time()
    time.sleep(p["dt"])
    with open(p["log"], "a") as fh:
        fh.write(json.dumps([t0, time.time(), os.environ.get("CUDA_VISIBLE_DEVICES")]) + "\\n")
    open(os.environ["COORD_RESULT"], "w").write("{}")
""")


@pytest.fixture
async def gpu_box(daemon_factory, tmp_path):
    """A coordd, a client, the fake NVML's state setter and a worker starter."""
    daemon = daemon_factory("reaper_interval_s = 0.3\nheartbeat_stale_s = 10\n")
    daemon.start()
    state = tmp_path / "nvml.json"
    readings = tmp_path / "readings.json"
    readings.write_text(json.dumps(COOL))
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    started: list[WorkerProc] = []

    def set_gpus(*gpus: tuple[int, int]) -> None:
        state.write_text(json.dumps({"gpus": [{"total_mb": t, "used_mb": u, "temp": 50}
                                              for t, u in gpus]}))

    def start_worker(slots: int = 2, extra: str = "", heartbeat_s: float = 0.3) -> WorkerProc:
        work_dir = tmp_path / "work"
        cfg = tmp_path / "w1.toml"
        cfg.write_text(
            f"lease_s = 5\nheartbeat_interval_s = {heartbeat_s}\ngrace_s = 0.5\nstop_timeout_s = 5\n"
            f"claim_interval_s = 0.1\nwork_dir = {json.dumps(str(work_dir))}\n{extra}\n"
            f"[kinds.g]\nargv = {json.dumps([sys.executable, str(model)])}\nslots = {slots}\n")
        env = {**os.environ, "FAKE_NVML_STATE": str(state),
               "PYTHONPATH": os.pathsep.join([str(FAKE_NVML), *sys.path])}
        log_path = tmp_path / "w1.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "worker", "--worker-id", "w1", "--roles", "cpu",
                 "--socket", daemon.socket, "--config", str(cfg),
                 "--readings-override", str(readings)], stdout=log, stderr=log, env=env)
        w = WorkerProc("w1", proc, log_path, work_dir)
        started.append(w)
        return w

    async with Client(daemon.socket, timeout=10) as client:
        yield client, set_gpus, start_worker, tmp_path
    stop_workers(started)


async def until(check, timeout: float = 20.0, what: str = "condition") -> Any:
    import asyncio
    import time
    t0 = time.monotonic()
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def enqueue(client: Client, log: Path, dt: float, **resources: int) -> str:
    return (await client.enqueue(kind="g", required_role="cpu", priority=1,
                                 payload={"dt": dt, "log": str(log)},
                                 resources=resources)).job_id


async def test_a_job_needing_more_vram_than_is_free_waits_then_runs_once_freed(gpu_box):
    client, set_gpus, start_worker, tmp = gpu_box
    set_gpus((16000, 12900))  # another program holds 12900 MiB
    start_worker()
    log = tmp / "runs.log"
    job = await enqueue(client, log, 0.1, gpus=1, vram_mb=8000)

    async def refused() -> Any:
        view = await client.get_job(job)
        return "vram: need 8000 MiB; free: 3100 on " in (view.waiting_reason or "")
    await until(refused, what="the vram refusal in show")
    workers = (await client.workers()).workers
    assert workers[0].resources["gpus"][0]["memory_used_mb"] == 12900
    assert (await client.get_job(job)).status == "waiting"
    set_gpus((16000, 1000))  # it let go: the next heartbeat shows the VRAM free

    async def done() -> Any:
        return (await client.get_job(job)).status == "succeeded"
    await until(done, what="the job to run once the VRAM is free")
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) == 1 and runs[0][2] == "0"  # CUDA_VISIBLE_DEVICES: its granted GPU


@pytest.mark.parametrize("what", ["vram", "ram"])
async def test_two_jobs_whose_requests_exceed_the_box_never_run_at_once(gpu_box, what):
    client, set_gpus, start_worker, tmp = gpu_box
    set_gpus((16000, 0))
    start_worker(slots=2, extra="[resources]\nram_mb = 3000\n")  # two slots of the kind
    log = tmp / "runs.log"
    need = {"vram_mb": 10000} if what == "vram" else {"ram_mb": 2000}
    jobs = [await enqueue(client, log, 0.4, **need) for _ in range(3)]

    async def all_done() -> Any:
        return all([(await client.get_job(j)).status == "succeeded" for j in jobs])
    await until(all_done, timeout=30, what="all three jobs")
    runs = sorted(json.loads(line)[:2] for line in log.read_text().splitlines())
    assert len(runs) == 3
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(runs, runs[1:])), runs


async def test_without_nvidia_the_worker_advertises_zero_gpus_with_the_reason(gpu_box):
    client, set_gpus, start_worker, tmp = gpu_box
    (tmp / "nvml.json").write_text(json.dumps({"gpus": [], "init_error": "DriverNotLoaded"}))
    start_worker()
    job = await enqueue(client, tmp / "runs.log", 0.1, gpus=1)

    async def refused() -> Any:
        view = await client.get_job(job)
        return "gpus: need 1; has: 0 on " in (view.waiting_reason or "") \
            and " (NVML: " in view.waiting_reason \
            and "Driver Not Loaded" in view.waiting_reason
    await until(refused, what="the no-GPU refusal")
    w = (await client.workers()).workers[0]
    assert w.readings["gpus"] == 0 and "Driver Not Loaded" in w.readings["gpu_reason"]


async def test_the_next_gpu_job_starts_when_one_ends_not_at_the_next_heartbeat(gpu_box):
    client, set_gpus, start_worker, tmp = gpu_box
    set_gpus((16000, 0))
    start_worker(slots=2, heartbeat_s=6.0)  # its parked claim would wait for a heartbeat
    log = tmp / "runs.log"
    jobs = [await enqueue(client, log, 0.3, vram_mb=10000) for _ in range(4)]

    async def all_done() -> Any:
        return all([(await client.get_job(j)).status == "succeeded" for j in jobs])
    await until(all_done, timeout=40, what="all four jobs")
    runs = sorted(json.loads(line)[:2] for line in log.read_text().splitlines())
    gaps = [b_start - a_end for (_, a_end), (b_start, _) in zip(runs, runs[1:])]
    assert all(0 <= g < 2.5 for g in gaps), gaps  # the heartbeat after a GPU job's end
