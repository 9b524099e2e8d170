"""coord-worker over TCP + mutual TLS (issue 18): real coordd and worker processes on
loopback, certificates from coordd.net.pki."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from coordd.client import Client
from tests.integration.fleet_certs import make_fleet
from tests.integration.workerbench import COOL, DAEMON_FAST, MODEL, until, worker_toml


@pytest.fixture
def fleet(tmp_path):
    return make_fleet(tmp_path, time.time())


# A checkpointed model: on wa it writes a whole checkpoint and runs on (until wa is
# stopped); on any other worker it resumes from what it is handed and writes a result
# larger than the inline cap.
RESUMABLE = textwrap.dedent("""
    import json, os, sys, time
    d, resume = os.environ["COORD_CHECKPOINT_DIR"], os.environ["COORD_RESUME_FROM"]
    if not resume:
        with open(os.path.join(d, ".tmp-c"), "wb") as fh:
            fh.write(b"state:" + b"s" * 200000)
        os.replace(os.path.join(d, ".tmp-c"), os.path.join(d, "ckpt-1"))
        time.sleep(60)
    data = open(resume, "rb").read()
    with open(os.environ["COORD_RESULT"], "w") as fh:
        json.dump({"resumed": len(data), "head": data[:6].decode(), "by": os.environ["COORD_WORKER_ID"],
                   "pad": "x" * 300000}, fh)
""")


def start_tls_worker(tmp_path, fleet, worker_id: str, stem: str):
    """A worker on its "own host": work_dir (and so its local artifact store) under
    tmp_path/host-ID, apart from coordd's store beside the database."""
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    (tmp_path / "resumable.py").write_text(RESUMABLE)
    override = tmp_path / "readings.json"
    override.write_text(json.dumps(COOL))
    cfg = tmp_path / f"{worker_id}.toml"
    cfg.write_text(worker_toml(tmp_path / f"host-{worker_id}" / "work",
                               {"m": {"argv": [sys.executable, str(model)]},
                                "train": {"argv": [sys.executable, str(tmp_path / "resumable.py")],
                                          "max_result_bytes": 1 << 20}}))
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


def stop(proc) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(5)


@pytest.fixture(params=["sqlite", "postgresql"])
def tls_daemon(request, daemon_factory, fleet):
    """A started coordd with the fleet's TLS listener over each store in turn."""
    d = daemon_factory(DAEMON_FAST + fleet.config(), name=request.param)
    if request.param == "postgresql":
        d.store = request.getfixturevalue("pg_db")
    d.start()
    return d


async def test_checkpoint_and_large_result_travel_over_the_connection(tls_daemon, fleet,
                                                                       tmp_path):
    """A checkpointed `train` job starts on wa, is handed back when wa stops, and resumes on
    wb from the checkpoint wa uploaded; wb's result (over the inline cap) is uploaded too.
    Each worker's store is its own folder: nothing passes through a shared filesystem. On
    PostgreSQL both live in the database (issue 28)."""
    d = tls_daemon
    store = Path(d.db).parent / "artifacts"
    async with Client(d.socket, timeout=10) as c:
        job = (await c.enqueue(kind="train", required_role="cpu", priority=1,
                               payload={})).job_id
        wa = start_tls_worker(tmp_path, fleet, "wa", "worker-wa")
        try:
            async def recorded():
                v = await c.get_job(job)
                return v.checkpoint if v.checkpoint else None
            ckpt = await until(recorded, 30, "checkpoint recorded")
        finally:
            assert stop(wa) == 0
        if d.store is None:
            assert Path(ckpt["path"]).parent.parent == store  # coordd's path, not wa's
        else:
            assert ckpt["path"] == "postgresql:" + ckpt["sha256"]
        assert await d.artifact_bytes(ckpt["sha256"]) == b"state:" + b"s" * 200000
        wb = start_tls_worker(tmp_path, fleet, "wb", "worker-wb")
        try:
            async def done():
                v = await c.get_job(job)
                return v if v.status in ("succeeded", "failed") else None
            view = await until(done, 30, "job ended")
        finally:
            stop(wb)
    wb_log = (tmp_path / "wb.log").read_text()
    assert view.status == "succeeded", (view.last_error, wb_log)
    art = view.artifact
    assert art is not None
    assert Path(art.path).parent.parent == store if d.store is None else \
        art.path == "postgresql:" + art.sha256
    result = json.loads(await d.artifact_bytes(art.sha256))
    assert result["resumed"] == 200006 and result["head"] == "state:" and result["by"] == "wb"
    assert len(result["pad"]) == 300000
    # wb fetched the checkpoint into its own store (by sha256), over the connection
    assert (tmp_path / "host-wb" / "artifacts" / ckpt["sha256"][:2] / ckpt["sha256"]).exists()
    assert not os.path.exists(tmp_path / "host-wb" / "artifacts" / ".uploads")
