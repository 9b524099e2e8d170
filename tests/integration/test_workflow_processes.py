"""Workflows with real processes (issue 8): a real coordd, real coord-worker processes
running the example story models, coordctl, and coordd SIGKILLed mid-graph."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from coordd.client import Client
from tests import ctlfork
from tests.integration.workerbench import COOL, DAEMON_FAST, worker_toml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "workflow.toml"
WAIT_S = 40.0


def story_kinds() -> dict[str, dict[str, Any]]:
    return {step: {"argv": [sys.executable, "-m", "worker.models.story", step,
                            "--payload", "{payload}", "--result", "{result}"]}
            for step in ("gather", "narrate", "build")}


class Fleet:
    """coord-worker processes against one daemon; all killed at teardown."""

    def __init__(self, tmp: Path, socket: str) -> None:
        self.tmp, self.socket = tmp, socket
        self.procs: list[subprocess.Popen] = []
        self.override = tmp / "readings.json"
        self.override.write_text(json.dumps(COOL))

    def start(self, worker_id: str, roles: list[str], **settings: Any) -> subprocess.Popen:
        cfg = self.tmp / f"{worker_id}.toml"
        kinds = {k: v for k, v in story_kinds().items() if k in roles}
        cfg.write_text(worker_toml(self.tmp / f"work-{worker_id}", kinds, **settings))
        with open(self.tmp / f"{worker_id}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "worker", "--worker-id", worker_id,
                 "--roles", ",".join(roles), "--socket", self.socket, "--config", str(cfg),
                 "--readings-override", str(self.override)], stdout=log, stderr=log)
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:]
                         for p in sorted(self.tmp.glob("*.log")))

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


@pytest.fixture
def fleet(tmp_path):
    made: list[Fleet] = []

    def make(socket: str) -> Fleet:
        f = Fleet(tmp_path, socket)
        made.append(f)
        return f
    yield make
    for f in made:
        f.close()


async def until_done(client: Client, workflow_id: str, timeout: float = WAIT_S,
                     logs: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        wf = await client.workflow_get(workflow_id)
        if wf.status != "running":
            return wf
        assert time.monotonic() < deadline, (
            f"workflow still running: {[(n.name, n.status) for n in wf.nodes]}\n"
            + (logs() if logs else ""))
        await asyncio.sleep(0.1)


def coordctl(socket: str, *args: str) -> subprocess.CompletedProcess:
    return ctlfork.run(["--socket", socket, *args], timeout=30)  # python -m coordctl


async def test_story_with_every_capability_runs_in_order(daemon_factory, fleet):
    """Must show 1: gather -> narrate -> build with a real coord-worker offering all three
    capabilities, submitted with coordctl from the example file."""
    d = daemon_factory(DAEMON_FAST)
    d.start()
    f = fleet(d.socket)
    f.start("box1", ["gather", "narrate", "build"])
    out = coordctl(d.socket, "--json", "workflow", "submit", str(EXAMPLE))
    assert out.returncode == 0, out.stderr
    sub = json.loads(out.stdout)
    async with Client(d.socket, timeout=10) as c:
        wf = await until_done(c, sub["workflow_id"], logs=f.logs)
        assert wf.status == "succeeded", (wf, f.logs())
        jobs = {n.name: await c.get_job(n.job_id) for n in wf.nodes}
    gather, narrate, build = jobs["gather"], jobs["narrate"], jobs["build"]
    assert gather.finished_at <= narrate.created_at + 1e9  # sanity
    assert gather.finished_at < narrate.finished_at < build.finished_at
    # each node got its parents' output, stored in its payload when it was queued
    assert narrate.payload["inputs"] == {"gather": gather.result}
    assert build.payload["inputs"] == {"narrate": narrate.result, "gather": gather.result}
    assert gather.result["evidence"] and narrate.result["claims"][0]["label"] == "fact"
    assert build.result["facts"] == len(gather.result["evidence"])
    assert build.result["markdown"].startswith("# About json")
    for j in jobs.values():
        assert j.attempts == 1 and [e.to_status for e in j.events].count("succeeded") == 1
    assert [e.to_status for e in narrate.events][:2] == ["blocked", "waiting"]
    assert wf.summary == {"succeeded": ["gather", "narrate", "build"], "failed": [],
                          "skipped": [], "cancelled": [], "missing_roles": []}
    show = coordctl(d.socket, "workflow", "show", sub["workflow_id"])
    assert show.returncode == 0, show.stderr
    assert "gather" in show.stdout and "build" in show.stdout and "succeeded" in show.stdout
    listed = coordctl(d.socket, "--json", "workflow", "list")
    assert json.loads(listed.stdout)["workflows"][0]["status"] == "succeeded"


async def test_story_without_build_worker_ends_partial(daemon_factory, fleet):
    """Must show 2, with real processes: no `build` worker -> build skipped
    (worker_absent) after the configured wait; the workflow ends, no hang."""
    d = daemon_factory(DAEMON_FAST + "workflow_absent_wait_s = 1.5\n")
    d.start()
    f = fleet(d.socket)
    f.start("box1", ["gather", "narrate"])
    out = coordctl(d.socket, "--json", "workflow", "submit", str(EXAMPLE))
    assert out.returncode == 0, out.stderr
    async with Client(d.socket, timeout=10) as c:
        wf = await until_done(c, json.loads(out.stdout)["workflow_id"], logs=f.logs)
    assert wf.status == "partial"
    assert [(n.name, n.status) for n in wf.nodes] == [
        ("gather", "succeeded"), ("narrate", "succeeded"), ("build", "skipped")]
    assert wf.nodes[2].reason.startswith("worker_absent")
    assert wf.summary["missing_roles"] == ["build"]
    assert wf.nodes[1].result["claims"]  # the partial result is there
    show = coordctl(d.socket, "workflow", "show", wf.workflow_id)
    assert "worker_absent" in show.stdout and "capabilities to add" in show.stdout


async def test_sigkill_mid_graph_resumes_and_no_node_succeeds_twice(store_daemon_factory, fleet):
    """Must show 3: coordd SIGKILLed while narrate runs on a real worker, restarted on
    the same files (or PostgreSQL database): the graph goes on where it stood; every node
    succeeds exactly once. On both stores."""
    d = store_daemon_factory(DAEMON_FAST)
    d.start()
    f = fleet(d.socket)
    f.start("box1", ["gather", "narrate", "build"], lease_s=15)
    spec = {"name": "story", "nodes": [
        {"name": "gather", "kind": "gather", "required_role": "gather",
         "payload": {"module": "json"}},
        {"name": "narrate", "kind": "narrate", "required_role": "narrate",
         "needs": ["gather"], "result_schema": "claims", "payload": {"sleep_s": 3}},
        {"name": "build", "kind": "build", "required_role": "build", "needs": ["narrate"]}]}
    async with Client(d.socket, timeout=10) as c:
        sub = await c.workflow_submit(spec)
        deadline = time.monotonic() + WAIT_S
        while (await c.get_job(sub.jobs["narrate"])).status != "running":
            assert time.monotonic() < deadline, f.logs()
            await asyncio.sleep(0.05)
    d.kill()  # mid-graph: gather done, narrate running, build blocked
    d.start()
    async with Client(d.socket, timeout=10) as c:
        before = await c.workflow_get(sub.workflow_id)
        assert [n.status for n in before.nodes][0] == "succeeded"
        assert before.nodes[2].status == "blocked"
        wf = await until_done(c, sub.workflow_id, logs=f.logs)
        assert wf.status == "succeeded", (wf, f.logs())
        jobs = [await c.get_job(n.job_id) for n in wf.nodes]
    for j in jobs:
        assert [e.to_status for e in j.events].count("succeeded") == 1, j.events
    assert jobs[2].payload["inputs"]["narrate"] == jobs[1].result


async def test_sigkill_between_steps_driven_by_hand(store_daemon_factory):
    """Must show 3, deterministic: kill after gather's completion was acknowledged and
    narrate was claimed; after restart narrate's lease still holds, its completion
    queues build, and gather's result is not produced again. On both stores."""
    d = store_daemon_factory(DAEMON_FAST)
    d.start()
    spec = json.loads(json.dumps({"name": "s", "nodes": [
        {"name": "gather", "kind": "gather", "required_role": "cpu"},
        {"name": "narrate", "kind": "narrate", "required_role": "cpu", "needs": ["gather"]},
        {"name": "build", "kind": "build", "required_role": "cpu", "needs": ["narrate"]}]}))
    async with Client(d.socket, timeout=10) as c:
        sub = await c.workflow_submit(spec)
        await c.heartbeat("w", ["cpu"], COOL)
        g = await c.claim("w", lease_s=600)
        assert g.job.kind == "gather"
        assert (await c.complete(g.job.job_id, "w", g.lease.token, {"g": 1})).status == \
            "succeeded"
        n = await c.claim("w", lease_s=600)
        assert n.job.kind == "narrate" and n.job.payload["inputs"] == {"gather": {"g": 1}}
    d.kill()
    d.start()
    async with Client(d.socket, timeout=10) as c:
        await c.heartbeat("w", ["cpu"], COOL)
        assert (await c.claim("w", lease_s=600)).job is None  # build is still blocked
        assert (await c.complete(n.job.job_id, "w", n.lease.token, {"n": 2})).status == \
            "succeeded"
        b = await c.claim("w", lease_s=600)
        assert b.job.kind == "build" and b.job.payload["inputs"] == {"narrate": {"n": 2}}
        await c.complete(b.job.job_id, "w", b.lease.token, {"b": 3})
        wf = await c.workflow_get(sub.workflow_id)
        assert wf.status == "succeeded"
        for node in wf.nodes:
            job = await c.get_job(node.job_id)
            assert job.attempts == 1
            assert [e.to_status for e in job.events].count("succeeded") == 1


async def test_schema_refusals_with_a_real_worker_dead_letter(daemon_factory, fleet):
    """Must show 4, with real processes: narrate's worker keeps returning a fact without
    evidence; three refused results end it `failed`, and build (policy skip) is skipped."""
    d = daemon_factory(DAEMON_FAST)
    d.start()
    f = fleet(d.socket)
    f.start("box1", ["gather", "narrate", "build"])
    spec = {"name": "bad", "nodes": [
        {"name": "gather", "kind": "gather", "required_role": "gather",
         "payload": {"module": "json"}},
        {"name": "narrate", "kind": "narrate", "required_role": "narrate", "max_attempts": 3,
         "needs": ["gather"], "result_schema": "claims", "payload": {"uncited": True}},
        {"name": "build", "kind": "build", "required_role": "build", "needs": ["narrate"]}]}
    async with Client(d.socket, timeout=10) as c:
        sub = await c.workflow_submit(spec)
        wf = await until_done(c, sub.workflow_id, logs=f.logs)
        narrate = await c.get_job(sub.jobs["narrate"])
    assert wf.status == "partial"
    assert [n.status for n in wf.nodes] == ["succeeded", "failed", "skipped"]
    assert narrate.attempts == 3 and narrate.result is None
    refusals = [e.reason for e in narrate.events if e.from_status == "running"]
    assert len(refusals) == 3
    assert all("claim labelled fact cites no evidence" in r for r in refusals)
    assert wf.summary["skipped"] == [{"node": "build", "reason": "dependency_failed: narrate"}]


def test_coordctl_schedule_add_list_rm(daemon):
    text = EXAMPLE.read_text()
    path = Path(daemon.db).with_name("sched.toml")
    path.write_text('schedule = "*/5 * * * *"\n' + text)
    refused = coordctl(daemon.socket, "workflow", "submit", str(path))
    assert refused.returncode == 2 and "schedule add" in refused.stderr
    added = coordctl(daemon.socket, "--json", "schedule", "add", str(path), "--name", "five")
    assert added.returncode == 0, added.stderr
    view = json.loads(added.stdout)
    assert view["cron"] == "*/5 * * * *" and view["next_at"] % 300 == 0
    assert "five" in coordctl(daemon.socket, "schedule", "list").stdout
    again = coordctl(daemon.socket, "schedule", "add", str(path), "--name", "five")
    assert again.returncode == 0 and "(exists, identical)" in again.stdout
    other = coordctl(daemon.socket, "schedule", "add", str(path), "--name", "five",
                     "--cron", "0 * * * *")
    assert other.returncode == 1
    assert "invalid_state: schedule five exists with a different cron" in other.stderr
    replaced = coordctl(daemon.socket, "schedule", "add", str(path), "--name", "five",
                        "--cron", "0 * * * *", "--replace")
    assert replaced.returncode == 0 and "(replaced): 0 * * * *" in replaced.stdout
    bad = coordctl(daemon.socket, "schedule", "add", str(EXAMPLE), "--cron", "nope")
    assert bad.returncode == 1 and "bad_request" in bad.stderr
    cyc = Path(daemon.db).with_name("cycle.json")
    cyc.write_text(json.dumps({"name": "c", "nodes": [
        {"name": "a", "kind": "k", "required_role": "r", "needs": ["b"]},
        {"name": "b", "kind": "k", "required_role": "r", "needs": ["a"]}]}))
    refused = coordctl(daemon.socket, "workflow", "submit", str(cyc))
    assert refused.returncode == 1
    assert "bad_request: dependency cycle: a -> b -> a" in refused.stderr
    assert coordctl(daemon.socket, "schedule", "rm", "five").returncode == 0
    assert coordctl(daemon.socket, "schedule", "rm", "five").returncode == 1


async def test_schedule_slots_start_once_across_sigkill(daemon_factory):
    """Must show 5, with a real coordd: a due slot starts one workflow; coordd SIGKILLed
    right after and restarted does not start it again; the next slot starts once more.
    Slots are made due by moving the schedule's next_at from outside (a yearly cron keeps
    the real next slot far away), so the test does not wait for a minute boundary."""
    d = daemon_factory(DAEMON_FAST)
    d.start()
    added = coordctl(d.socket, "--json", "schedule", "add", str(EXAMPLE), "--cron", "0 0 1 1 *",
                     "--name", "yearly")
    assert added.returncode == 0, added.stderr
    sid = json.loads(added.stdout)["schedule_id"]

    def make_due(slot: float) -> None:
        with sqlite3.connect(d.db, timeout=10) as conn:
            conn.execute("UPDATE schedules SET next_at = ? WHERE schedule_id = ?", (slot, sid))

    async def started(n: int) -> list[Any]:
        async with Client(d.socket, timeout=10) as c:
            deadline = time.monotonic() + WAIT_S
            while True:
                wfs = (await c.workflow_list()).workflows
                if len(wfs) >= n:
                    return wfs
                assert time.monotonic() < deadline, d.log()
                await asyncio.sleep(0.05)

    slots = [float(int(time.time()) - 30), float(int(time.time()) - 10)]
    for i, slot in enumerate(slots, 1):
        make_due(slot)
        await started(i)
        d.kill()  # at once after the start: no clean shutdown
        d.start()
        await asyncio.sleep(1.0)  # several maintenance rounds of the restarted coordd
        wfs = await started(i)
        assert len(wfs) == i, [w.idempotency_key for w in wfs]
    assert sorted(w.idempotency_key for w in wfs) == [f"schedule:{sid}:{s:.0f}" for s in slots]
    listed = json.loads(coordctl(d.socket, "--json", "schedule", "list").stdout)["schedules"][0]
    assert listed["fired"] == 2 and listed["last_slot"] == slots[1]
    assert listed["next_at"] > time.time() + 86400  # back to the yearly slot


def test_workflow_show_and_cancel_take_a_unique_prefix(daemon):
    """As `show` does for jobs: the shortest unique start of an id names the workflow (and
    a waiting node says why it waits); a start shared by several is refused naming them."""
    ids = [json.loads(coordctl(daemon.socket, "--json", "workflow", "submit",
                               str(EXAMPLE)).stdout)["workflow_id"] for _ in range(3)]
    for wf_id in ids:
        n = next(n for n in range(1, len(wf_id) + 1)
                 if sum(i.startswith(wf_id[:n]) for i in ids) == 1)
        shown = coordctl(daemon.socket, "--json", "workflow", "show", wf_id[:n])
        assert shown.returncode == 0 and json.loads(shown.stdout)["workflow_id"] == wf_id
        waiting = [n for n in json.loads(shown.stdout)["nodes"] if n["status"] == "waiting"]
        assert waiting and all(n["reason"] == f"no live worker with role {n['required_role']}"
                               for n in waiting)  # why a waiting node is not running
    assert "no live worker with role" in coordctl(daemon.socket, "workflow", "show",
                                                  ids[0]).stdout
    common = os.path.commonprefix(ids)
    amb = coordctl(daemon.socket, "workflow", "cancel", common)
    assert amb.returncode == 1 and "bad_request" in amb.stderr and "ambiguous" in amb.stderr
    assert all(i in amb.stderr for i in ids)
    gone = coordctl(daemon.socket, "workflow", "show", "zzzz")
    assert gone.returncode == 1 and "not_found" in gone.stderr
    n = next(n for n in range(1, 40) if sum(i.startswith(ids[0][:n]) for i in ids) == 1)
    cancelled = coordctl(daemon.socket, "--json", "workflow", "cancel", ids[0][:n])
    assert cancelled.returncode == 0 and json.loads(cancelled.stdout)["status"] == "cancelled"
    assert json.loads(coordctl(daemon.socket, "--json", "workflow", "show",
                               ids[1]).stdout)["status"] != "cancelled"
