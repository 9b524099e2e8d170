"""Soak (issue 7, item 4): workers and their model processes killed and restarted at random
while a batch drains. Every job ends `succeeded` exactly once; the model-process runs that
finished are counted beside the jobs (the gap is what the crashes cost in re-execution).

The default run is small (3 workers, 60 jobs, a kill every ~0.5 s); `-m slow` runs the
issue's size (8 workers, 2,000 jobs).
"""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from coordd.client import SyncClient

DAEMON = """
reaper_interval_s = 0.3
heartbeat_stale_s = 5
lease_default_s = 2
backoff_base_s = 0.1
backoff_cap_s = 0.2
max_attempts_default = 50
"""
MODEL = textwrap.dedent("""
    import json, os, sys, time
    p = json.load(open(os.environ["COORD_PAYLOAD"]))
    time.sleep(p["sleep"])
    with open(os.environ["COORD_RESULT"], "w") as fh:
        json.dump({"n": p["n"], "by": os.environ["COORD_WORKER_ID"]}, fh)
    fd = os.open(os.environ["RUNS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, (os.environ["COORD_JOB_ID"] + "\\n").encode())
    os.close(fd)
""")


def _worker_toml(tmp: Path, runs_log: Path) -> Path:
    (tmp / "model.py").write_text(MODEL)
    path = tmp / "worker.toml"
    path.write_text(textwrap.dedent(f"""
        lease_s = 2
        heartbeat_interval_s = 0.5
        claim_interval_s = 0.05
        grace_s = 0.3
        stop_timeout_s = 5
        work_dir = "{tmp / 'work'}"
        [kinds.quick]
        argv = ["{{python}}", "{tmp / 'model.py'}"]
        timeout_s = 30
        slots = 2
        env = {{ RUNS_LOG = "{runs_log}" }}
    """))
    return path


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a supervisor and every model process below it (a power cut of one worker)."""
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(10)


def _soak(daemon_factory, tmp_path: Path, workers: int, jobs: int, kill_every_s: float,
          timeout_s: float) -> tuple[int, int, int]:
    d = daemon_factory(DAEMON)
    d.start()
    runs_log = tmp_path / "runs.log"
    cfg = _worker_toml(tmp_path, runs_log)
    rng = random.Random(1234)

    def start(i: int) -> subprocess.Popen:
        log = open(tmp_path / f"w{i}.log", "ab")
        p = subprocess.Popen([sys.executable, "-m", "worker", "--worker-id", f"w{i}",
                              "--roles", "cpu", "--socket", d.socket, "--config", str(cfg)],
                             stdout=log, stderr=log)
        log.close()
        return p

    procs = {i: start(i) for i in range(workers)}
    kills = 0
    try:
        with SyncClient(d.socket, timeout=30) as c:
            ids = [r.job_id for r in c.enqueue_batch(
                [{"kind": "quick", "required_role": "cpu", "priority": rng.randrange(4),
                  "payload": {"n": n, "sleep": rng.choice([0.0, 0.05, 0.2])},
                  "gates": {"min_user_idle_s": None, "require_mains": False}}
                 for n in range(jobs)]).jobs]
            deadline = time.monotonic() + timeout_s
            next_kill = time.monotonic() + kill_every_s
            while True:
                st = c.status()
                if st.jobs["succeeded"] + st.jobs["failed"] + st.jobs["cancelled"] >= jobs:
                    break
                assert time.monotonic() < deadline, f"soak did not drain: {st.jobs}"
                if time.monotonic() >= next_kill:
                    i = rng.randrange(workers)
                    _kill_tree(procs[i])
                    procs[i] = start(i)
                    kills += 1
                    next_kill = time.monotonic() + kill_every_s * rng.uniform(0.5, 1.5)
                time.sleep(0.05)
            assert st.jobs["succeeded"] == jobs, st.jobs
            for job_id in ids[:: max(1, jobs // 50)]:
                assert c.get_job(job_id).result["n"] >= 0
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                _kill_tree(p)
    assert d.stop() == 0
    conn = sqlite3.connect(f"file:{d.db}?mode=ro", uri=True)
    try:
        once = conn.execute(
            "SELECT count(*) FROM (SELECT job_id FROM job_events WHERE to_status = 'succeeded' "
            "GROUP BY job_id HAVING count(*) = 1)").fetchone()[0]
        twice = conn.execute(
            "SELECT count(*) FROM (SELECT job_id FROM job_events WHERE to_status = 'succeeded' "
            "GROUP BY job_id HAVING count(*) > 1)").fetchone()[0]
        assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    assert (once, twice) == (jobs, 0), "a job succeeded twice or not at all"
    runs = len(runs_log.read_text().splitlines())
    assert runs >= jobs
    print(f"\nsoak: {workers} workers, {jobs} jobs, {kills} worker kills, "
          f"{runs} model runs finished ({runs - jobs} re-executions)")
    return jobs, runs, kills


def test_soak_small_every_job_succeeds_exactly_once(daemon_factory, tmp_path):
    jobs, runs, kills = _soak(daemon_factory, tmp_path, workers=3, jobs=60,
                              kill_every_s=0.5, timeout_s=90)
    assert kills >= 1


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the round allows itself 900 s; the suite's 120 s stopped it
def test_soak_full_8_workers_2000_jobs(daemon_factory, tmp_path):
    jobs, runs, kills = _soak(daemon_factory, tmp_path, workers=8, jobs=2000,
                              kill_every_s=1.0, timeout_s=900)
    assert kills >= 10
