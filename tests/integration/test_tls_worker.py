"""coord-worker over TCP + mutual TLS (issue 18): real coordd and worker processes on
loopback, certificates from coordd.pki."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from coordd.client import Client
from tests.integration.fleet_certs import make_fleet
from tests.integration.test_worker import COOL, DAEMON_FAST, MODEL, until, worker_toml


@pytest.fixture
def fleet(tmp_path):
    return make_fleet(tmp_path, time.time())


def start_tls_worker(tmp_path, fleet, worker_id: str, stem: str):
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    override = tmp_path / "readings.json"
    override.write_text(json.dumps(COOL))
    cfg = tmp_path / f"{worker_id}.toml"
    cfg.write_text(worker_toml(tmp_path / f"work-{worker_id}",
                               {"m": {"argv": [sys.executable, str(model)]}}))
    files = fleet.files(stem)
    log = open(tmp_path / f"{worker_id}.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", "--worker-id", worker_id, "--roles", "cpu",
         "--connect", f"tls://127.0.0.1:{fleet.port}", "--cert", files.cert, "--key", files.key,
         "--ca", files.ca, "--config", str(cfg), "--readings-override", str(override)],
        stdout=log, stderr=log)
    log.close()
    return proc


async def test_worker_over_mtls_runs_jobs_end_to_end(daemon_factory, fleet, tmp_path):
    d = daemon_factory(DAEMON_FAST + fleet.config())
    d.start()
    wa = start_tls_worker(tmp_path, fleet, "wa", "worker-wa")
    # a worker whose certificate names another id does not start
    wrong = start_tls_worker(tmp_path, fleet, "wz", "worker-wb")
    assert wrong.wait(10) == 2
    assert "certificate of worker wb, not wz" in (tmp_path / "wz.log").read_text()
    try:
        async with Client(d.socket, timeout=10) as c:
            jobs = [(await c.enqueue(kind="m", required_role="cpu", priority=1,
                                     payload={"echo": i})).job_id for i in range(3)]

            async def done():
                views = [await c.get_job(j) for j in jobs]
                return views if all(v.status == "succeeded" for v in views) else None
            views = await until(done, 30, "jobs succeeded over mTLS")
            assert [v.result["echo"] for v in views] == [0, 1, 2]
            assert {v.result["worker"] for v in views} == {"wa"}
            workers = {w.worker_id for w in (await c.workers()).workers}
            assert "wa" in workers and "wz" not in workers
    finally:
        for p in (wa, wrong):
            p.send_signal(signal.SIGTERM)
        for p in (wa, wrong):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    assert wa.returncode == 0
