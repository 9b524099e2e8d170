"""Fleet-wide limits with real processes (issue 17): a real coordd, real coord-worker
processes and model processes; how many jobs run at once is read from coordd's own event
log (in event id order: the order of its transactions), not from the workers. Also
`coordctl limits` (show, set, reset) against the daemon.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from coordd.client import Client
from tests import ctlfork
from tests.integration.workerbench import (
    COOL, WorkerProc, stop_workers, until, worker_toml,
)

DAEMON = """
reaper_interval_s = 0.3
heartbeat_stale_s = 5
[limits.lic]
concurrency = 3
[limits.api]
concurrency = 3
reserve = {{ p0 = 1 }}
[limits.llm]
budget = {{ tokens = "100/day" }}
"""
FAST_MODEL = ["/bin/sh", "-c", 'sleep {sleep}; {usage}echo 1 > "$COORD_RESULT"']


@pytest.fixture
async def fleet(daemon_factory, tmp_path):
    """A coordd with limits `lic` (concurrency 3) and `api` (3, one kept for P0), and a
    factory of workers running the shell model `m` (payload ignored; sleep from argv)."""
    daemon = daemon_factory(DAEMON.format())
    daemon.start()
    override = tmp_path / "readings.json"
    override.write_text(json.dumps(COOL))
    started: list[WorkerProc] = []

    def start(worker_id: str, sleep: float, slots: int = 1, usage: str = "") -> WorkerProc:
        report = f"echo '{usage}' > \"$COORD_USAGE\"; " if usage else ""
        argv = [FAST_MODEL[0], FAST_MODEL[1], FAST_MODEL[2].format(sleep=sleep, usage=report)]
        work_dir = tmp_path / f"work-{worker_id}"
        cfg = tmp_path / f"{worker_id}.toml"
        cfg.write_text(worker_toml(work_dir, {"m": {"argv": argv, "slots": slots}},
                                   lease_s=10))
        log_path = tmp_path / f"{worker_id}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "worker", "--worker-id", worker_id, "--roles", "cpu",
                 "--socket", daemon.socket, "--config", str(cfg),
                 "--readings-override", str(override)], stdout=log, stderr=log)
        w = WorkerProc(worker_id, proc, log_path, work_dir)
        started.append(w)
        return w

    async with Client(daemon.socket, timeout=10) as client:
        yield daemon, client, start
    stop_workers(started)


async def events(client: Client) -> list[Any]:
    out, after = [], 0
    while True:
        res = await client.watch_events(after=after, limit=1000)
        out += res.events
        if not res.events:
            return out
        after = res.next_after


def most_running(evs: list[Any]) -> int:
    """The most jobs running at once, stepping through the events in id order."""
    running: set[str] = set()
    most = 0
    for e in evs:
        if e.to_status == "running" and e.from_status == "waiting":
            running.add(e.job_id)
            most = max(most, len(running))
        elif e.from_status == "running" and e.to_status != "running":
            running.discard(e.job_id)
    return most


async def drain(client: Client, start: Any, jobs: int, timeout: float) -> list[Any]:
    ids = [r.job_id for r in (await client.enqueue_batch(
        [{"kind": "m", "required_role": "cpu", "priority": 2, "limits": ["lic"]}
         for _ in range(jobs)])).jobs]
    workers = [start(f"w{i}", 0.01, slots=2) for i in range(4)]

    async def done() -> bool:
        st = await client.status()
        return st.jobs["succeeded"] + st.jobs["failed"] == jobs
    await until(done, timeout, f"{jobs} jobs drained")
    st = await client.status()
    assert st.jobs["succeeded"] == jobs, [w.log()[-2000:] for w in workers]
    evs = [e for e in await events(client) if e.job_id in set(ids)]
    assert most_running(evs) == 3  # 4 workers x 2 slots could run 8
    view = (await client.limits("lic")).limits[0]
    assert view.used == 0 and view.holders == []
    return evs


async def test_four_workers_drain_200_jobs_never_more_than_3_running(fleet):
    """4 workers with 2 slots each (8 could run) drain 200 jobs naming `lic` (concurrency
    3): all succeed, and coordd's events never show more than 3 running (~6 s here)."""
    daemon, client, start = fleet
    await drain(client, start, 200, 120.0)


async def test_p0_starts_at_once_while_p3_fill_the_unreserved_units(fleet):
    daemon, client, start = fleet
    p3 = [(await client.enqueue(kind="m", required_role="cpu", priority=3, limits=["api"])
           ).job_id for _ in range(3)]
    for i in range(4):
        start(f"w{i}", 30.0)

    async def two_running() -> bool:
        return (await client.limits("api")).limits[0].used == 2
    await until(two_running, 20.0, "P3 jobs holding the 2 unreserved units")
    third = await client.get_job(p3[2])
    assert third.status == "waiting"
    assert third.waiting_reason == "limit api: 2/3 running (1 kept for P0)"
    t0 = time.monotonic()
    p0 = (await client.enqueue(kind="m", required_role="cpu", priority=0,
                               limits=["api"])).job_id

    async def p0_running() -> bool:
        return (await client.get_job(p0)).status == "running"
    await until(p0_running, 10.0, "the P0 job running")
    assert time.monotonic() - t0 < 3.0  # idle workers' parked claims take it at once
    assert (await client.get_job(p3[2])).status == "waiting"


def coordctl(sock: str, *args: str) -> subprocess.CompletedProcess:
    return ctlfork.run(["--socket", sock, *args], timeout=30)  # python -m coordctl


async def test_coordctl_limits_show_set_reset(fleet):
    daemon, client, start = fleet
    job = (await client.enqueue(kind="m", required_role="cpu", priority=1,
                                limits=[{"name": "lic", "units": 2}])).job_id
    out = coordctl(daemon.socket, "limits")
    assert out.returncode == 0, out.stderr
    assert "lic" in out.stdout and "api" in out.stdout and "p0=1" in out.stdout
    out = coordctl(daemon.socket, "limits", "set", "lic", "concurrency=5", "rate=10/min",
                   "reserve.p0=2")
    assert out.returncode == 0, out.stderr
    assert "0/5" in out.stdout and "0/10/min" in out.stdout
    doc = json.loads(coordctl(daemon.socket, "--json", "limits", "lic").stdout)
    lic = doc["limits"][0]
    assert (lic["concurrency"], lic["rate"], lic["reserve"], lic["source"], lic["waiting"]) \
        == (5, "10/min", {"p0": 2}, "config+runtime", 1)
    bad = coordctl(daemon.socket, "limits", "set", "lic", "rate=lots")
    assert bad.returncode == 1 and "bad_request" in bad.stderr and "rate" in bad.stderr
    unknown = coordctl(daemon.socket, "enqueue", "--kind", "m", "--role", "cpu",
                       "--priority", "1", "--payload", "{}", "--limit", "nope")
    assert unknown.returncode == 1 and "unknown limit 'nope'" in unknown.stderr
    ok = coordctl(daemon.socket, "enqueue", "--kind", "m", "--role", "cpu", "--priority", "1",
                  "--payload", "{}", "--limit", "lic:2", "--limit", "api")
    assert ok.returncode == 0, ok.stderr
    shown = json.loads(coordctl(daemon.socket, "--json", "show", ok.stdout.strip()).stdout)
    assert shown["limits"] == [{"name": "api", "units": 1}, {"name": "lic", "units": 2}]
    human = coordctl(daemon.socket, "show", ok.stdout.strip()).stdout
    assert "api, lic x2" in human
    daemon.stop()  # the runtime setting is kept over a restart
    daemon.start()
    doc = json.loads(coordctl(daemon.socket, "--json", "limits", "lic").stdout)
    assert doc["limits"][0]["concurrency"] == 5
    out = coordctl(daemon.socket, "limits", "reset", "lic")
    assert out.returncode == 0 and "0/3" in out.stdout, out.stderr
    assert job


async def test_usage_the_model_reports_counts_against_the_budget(fleet):
    daemon, client, start = fleet
    first = (await client.enqueue(kind="m", required_role="cpu", priority=3,
                                  limits=["llm"])).job_id
    start("w0", 0.01, usage='{"tokens": 120}')

    async def done() -> bool:
        return (await client.get_job(first)).status == "succeeded"
    await until(done, 20.0, "the first job done")
    view = (await client.limits("llm")).limits[0]
    assert view.budget_used == {"tokens": 120.0}
    second = (await client.enqueue(kind="m", required_role="cpu", priority=3,
                                   limits=["llm"])).job_id
    job = await client.get_job(second)
    assert job.status == "waiting"
    assert job.waiting_reason == "limit llm: budget tokens 120/100/day used"
