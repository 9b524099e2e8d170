"""Workflows (issue 8) on a pinned clock: graphs, capability routing, degradation, result
schemas, retry and cancel of nodes, prune. No sleeps: time moves with FakeClock. Schedules
are in tests/unit/test_schedules.py, the v2 -> v5 migration in
tests/unit/test_workflow_migration.py."""

from __future__ import annotations

import random
import sqlite3
from typing import Any

import msgspec
import pytest

from coordd import config as config_mod
from coordd import errors
from coordd.clock import FakeClock
from coordd.wire.protocol import Complete, Fail, Heartbeat, JobId
from coordd.wire.workflows import ListWorkflows, WorkflowId, WorkflowSubmit
from coordd.daemon.server import sqlite_coordinator
from coordd.service import Coordinator
from tests.conftest import T0

ROLES = ["gather", "narrate", "build"]
EVIDENCE = [{"id": "e1", "text": "json encodes Python objects", "source": "json"}]
GOOD_CLAIMS = {"claims": [{"text": "json encodes objects", "label": "Fact ",
                           "evidence": ["e1"]}], "evidence": EVIDENCE}
BAD_CLAIMS = {"claims": [{"text": "json is the best format", "label": "fact"}],
              "evidence": EVIDENCE}


def story(**narrate: Any) -> WorkflowSubmit:
    """gather -> narrate -> build, each node on its own capability."""
    return _convert({
        "name": "story",
        "nodes": [
            {"name": "gather", "kind": "gather", "required_role": "gather",
             "payload": {"module": "json"}},
            {"name": "narrate", "kind": "narrate", "required_role": "narrate",
             "needs": ["gather"], "result_schema": "claims", **narrate},
            {"name": "build", "kind": "build", "required_role": "build",
             "needs": ["narrate", {"node": "gather", "policy": "run"}]},
        ]})


def _convert(obj: dict[str, Any]) -> WorkflowSubmit:
    return msgspec.convert(obj, WorkflowSubmit)


async def run_node(bundle, worker: str, result: Any) -> Any:
    """Claim one job as `worker` and complete it with `result`; return (claimed job, reply)."""
    got = await bundle.claim(worker)
    assert got.job is not None, got.reasons
    reply = await bundle.coord.complete(Complete(job_id=got.job.job_id, worker_id=worker,
                                                 token=got.lease.token, result=result))
    return got.job, reply


async def test_story_runs_in_order_and_passes_results(bundle):
    for role in ROLES:
        await bundle.worker(role, roles=[role])
    sub = await bundle.coord.workflow_submit(story())
    assert sub.created and set(sub.jobs) == {"gather", "narrate", "build"}
    build = await bundle.coord.get_job(JobId(job_id=sub.jobs["build"]))
    assert (build.status, build.workflow_id, build.node) == ("blocked", sub.workflow_id, "build")
    assert build.waiting_reason == "blocked: waits for gather (waiting), narrate (blocked)"
    # only gather is claimable: narrate and build are blocked, whoever asks
    assert (await bundle.claim("narrate")).job is None
    assert (await bundle.claim("build")).job is None
    job, _ = await run_node(bundle, "gather", {"evidence": EVIDENCE})
    assert job.kind == "gather" and job.payload == {"module": "json"}
    job, reply = await run_node(bundle, "narrate", GOOD_CLAIMS)
    assert reply.status == "succeeded"
    assert job.payload["inputs"] == {"gather": {"evidence": EVIDENCE}}
    narrated = await bundle.coord.get_job(JobId(job_id=sub.jobs["narrate"]))
    assert narrated.result["claims"][0]["label"] == "fact"  # normalized before storing
    job, _ = await run_node(bundle, "build", {"markdown": "# json"})
    assert job.payload["inputs"]["narrate"] == narrated.result
    assert job.payload["inputs"]["gather"] == {"evidence": EVIDENCE}
    wf = await bundle.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert wf.status == "succeeded"
    assert [n.status for n in wf.nodes] == ["succeeded"] * 3
    assert wf.summary["succeeded"] == ["gather", "narrate", "build"]
    assert wf.summary["skipped"] == [] and wf.summary["missing_roles"] == []
    listed = await bundle.coord.workflow_list(ListWorkflows())
    assert listed.workflows[0].counts == {"succeeded": 3}


async def test_no_build_worker_skips_build_worker_absent(make_bundle):
    bundle = await make_bundle(workflow_absent_wait_s=300)
    for role in ("gather", "narrate"):
        await bundle.worker(role, roles=[role])
    sub = await bundle.coord.workflow_submit(story())
    await run_node(bundle, "gather", {"evidence": EVIDENCE})
    await run_node(bundle, "narrate", GOOD_CLAIMS)
    build = await bundle.coord.get_job(JobId(job_id=sub.jobs["build"]))
    assert build.status == "waiting"
    bundle.clock.advance(299)
    for role in ("gather", "narrate"):  # the others stay live; nobody offers `build`
        await bundle.worker(role, roles=[role])
    assert await bundle.coord.flows.tick() == (0, 0, 0)
    bundle.clock.advance(2)
    assert await bundle.coord.flows.tick() == (1, 0, 0)
    build = await bundle.coord.get_job(JobId(job_id=sub.jobs["build"]))
    assert build.status == "skipped" and build.last_error.startswith("worker_absent")
    assert build.events[-1].to_status == "skipped"
    assert build.events[-1].reason.startswith("worker_absent: no live worker with role build")
    wf = await bundle.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert wf.status == "partial"
    assert wf.summary["succeeded"] == ["gather", "narrate"]
    assert [s["node"] for s in wf.summary["skipped"]] == ["build"]
    assert wf.summary["missing_roles"] == ["build"]
    assert [n.result is not None for n in wf.nodes] == [True, True, False]


async def test_stale_worker_counts_as_absent_and_live_one_keeps_node(make_bundle):
    bundle = await make_bundle(workflow_absent_wait_s=60, heartbeat_stale_s=30)
    await bundle.worker("b", roles=["build"])
    sub = await bundle.coord.workflow_submit(_convert({"name": "one", "nodes": [
        {"name": "build", "kind": "build", "required_role": "build"}]}))
    bundle.clock.advance(50)
    await bundle.worker("b", roles=["build"])  # alive: the node waits on, however long
    bundle.clock.advance(20)
    assert (await bundle.coord.flows.tick())[0] == 0
    bundle.clock.advance(15)  # the heartbeat is 35 s old now: stale
    assert (await bundle.coord.flows.tick())[0] == 1
    wf = await bundle.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert wf.status == "failed" and wf.summary["missing_roles"] == ["build"]


async def test_schema_failing_three_times_dead_letters_and_dependents_follow_policy(bundle):
    for role in ROLES:
        await bundle.worker(role, roles=[role])
    spec = story(max_attempts=3)
    spec.nodes.append(_convert({"name": "x", "nodes": [
        {"name": "appendix", "kind": "build", "required_role": "build",
         "needs": [{"node": "narrate", "policy": "run"}, "gather"]}]}).nodes[0])
    sub = await bundle.coord.workflow_submit(spec)
    await run_node(bundle, "gather", {"evidence": EVIDENCE})
    errors_seen: list[str] = []
    for attempt in (1, 2, 3):
        job, reply = await run_node(bundle, "narrate", BAD_CLAIMS)
        assert job.attempts == attempt
        assert reply.status == ("failed" if attempt == 3 else "waiting")
        assert "claim labelled fact cites no evidence" in reply.error
        errors_seen.append(reply.error)
        bundle.clock.advance(3600)  # past any backoff; the workers stay live
        for role in ROLES:
            await bundle.worker(role, roles=[role])
    narrate = await bundle.coord.get_job(JobId(job_id=sub.jobs["narrate"]))
    assert narrate.status == "failed" and narrate.result is None
    assert "attempts exhausted" in narrate.last_error
    assert "cites no evidence" in narrate.last_error
    reasons = [e.reason for e in narrate.events if e.from_status == "running"]
    assert len(reasons) == 3 and all("result_invalid (claims)" in r for r in reasons)
    build = await bundle.coord.get_job(JobId(job_id=sub.jobs["build"]))
    assert build.status == "skipped" and build.last_error == "dependency_failed: narrate"
    job, _ = await run_node(bundle, "build", {"markdown": "appendix"})  # policy run
    assert job.job_id == sub.jobs["appendix"]
    assert job.payload["missing_inputs"] == ["narrate"]
    assert list(job.payload["inputs"]) == ["gather"]
    wf = await bundle.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert wf.status == "partial"
    assert wf.summary["failed"][0]["node"] == "narrate"
    assert "cites no evidence" in wf.summary["failed"][0]["reason"]
    assert wf.summary["skipped"] == [{"node": "build", "reason": "dependency_failed: narrate"}]


@pytest.mark.parametrize("result,message", [
    ({"claims": [{"text": "t", "label": "rumour"}]}, "not one of"),
    ({"claims": [{"text": "t", "label": "fact", "evidence": ["e9"]}]}, "unknown evidence"),
    ({"claims": [], "extra": 1}, "unknown field"),
    ({"claims": "none"}, "Expected `array`"),
])
async def test_result_schema_refusals(bundle, result, message):
    await bundle.worker("w1")
    job = await bundle.enqueue(result_schema="claims", max_attempts=1)
    got = await bundle.claim("w1")
    reply = await bundle.coord.complete(Complete(job_id=job, worker_id="w1",
                                                 token=got.lease.token, result=result))
    assert reply.status == "failed" and message in reply.error


async def test_failed_dependency_skips_and_plain_fail_settles(bundle):
    await bundle.worker("g", roles=["gather"])
    sub = await bundle.coord.workflow_submit(story())
    got = await bundle.claim("g")
    await bundle.coord.fail(Fail(job_id=got.job.job_id, worker_id="g", token=got.lease.token,
                                 error="boom", retryable=False))
    wf = await bundle.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert [n.status for n in wf.nodes] == ["failed", "skipped", "skipped"]
    assert wf.status == "failed"
    assert wf.nodes[2].reason == "dependency_skipped: narrate"


@pytest.mark.parametrize("nodes,message", [
    ([{"name": "a", "needs": ["b"]}, {"name": "b", "needs": ["a"]}], "cycle: a -> b -> a"),
    ([{"name": "a", "needs": ["a"]}], "cycle: a -> a"),
    ([{"name": "a", "needs": ["zz"]}], "unknown node 'zz'"),
    ([{"name": "a"}, {"name": "a"}], "duplicate node name 'a'"),
    ([{"name": "a"}, {"name": "b", "needs": [{"node": "a", "policy": "maybe"}]}], "policy"),
    ([{"name": "a", "result_schema": "nope"}], "unknown result_schema"),
])
async def test_bad_graphs_refused_and_nothing_queued(bundle, nodes, message):
    spec = _convert({"name": "bad", "nodes": [
        {"kind": "k", "required_role": "cpu", **n} for n in nodes]})
    with pytest.raises(errors.BadRequest, match=message.replace("(", r"\(")):
        await bundle.coord.workflow_submit(spec)
    assert sum((await bundle.coord.status()).jobs.values()) == 0
    assert (await bundle.coord.workflow_list(ListWorkflows())).workflows == []


async def test_submit_is_idempotent_by_key(bundle):
    spec = story()
    spec.idempotency_key = "story-1"
    a = await bundle.coord.workflow_submit(spec)
    b = await bundle.coord.workflow_submit(spec)
    assert a.created and not b.created
    assert (a.workflow_id, a.jobs) == (b.workflow_id, b.jobs)


async def test_cancel_blocked_node_settles_its_dependents(bundle):
    one = _convert({"name": "pair", "nodes": [
        {"name": "a", "kind": "k", "required_role": "cpu"},
        {"name": "b", "kind": "k", "required_role": "cpu", "needs": ["a"]}]})
    pair = await bundle.coord.workflow_submit(one)
    assert (await bundle.coord.cancel(JobId(job_id=pair.jobs["a"]))).status == "cancelled"
    b = await bundle.coord.get_job(JobId(job_id=pair.jobs["b"]))  # in the same transaction
    assert b.status == "skipped" and b.last_error == "dependency_cancelled: a"
    sub = await bundle.coord.workflow_submit(story())
    assert (await bundle.coord.cancel(JobId(job_id=sub.jobs["narrate"]))).status == "cancelled"
    build = await bundle.coord.get_job(JobId(job_id=sub.jobs["build"]))
    assert build.status == "blocked"  # gather (its `run` input) has not ended yet
    await bundle.worker("g", roles=["gather"])
    got = await bundle.claim("g")
    assert got.job.job_id == sub.jobs["gather"]
    await bundle.coord.complete(Complete(job_id=got.job.job_id, worker_id="g",
                                         token=got.lease.token, result={"evidence": []}))
    wf = await bundle.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert [n.status for n in wf.nodes] == ["succeeded", "cancelled", "skipped"]
    assert wf.status == "partial"


# ---------------------------------------------------------------- a Coordinator on a file


async def open_coord(path: str, clock: FakeClock) -> Coordinator:
    """A started Coordinator over the SQLite file `path` (opened again: a restart; also
    tests/unit/test_schedules.py and test_workflow_migration.py)."""
    coord = sqlite_coordinator(path, config_mod.load(None), clock, rng=random.Random(1))
    await coord.start()
    return coord


async def test_retry_of_skipped_node_reopens_the_workflow(make_bundle):
    """The way back from worker_absent: add a worker with the capability, retry."""
    bundle = await make_bundle(workflow_absent_wait_s=60)
    await bundle.worker("g", roles=["gather"])
    sub = await bundle.coord.workflow_submit(story())
    await run_node(bundle, "g", {"evidence": EVIDENCE})
    bundle.clock.advance(61)
    assert (await bundle.coord.flows.tick())[0] == 1  # narrate: no narrate worker
    wf = await bundle.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert wf.status == "partial" and [n.status for n in wf.nodes] == [
        "succeeded", "skipped", "skipped"]
    for role in ROLES:
        await bundle.worker(role, roles=[role])
    assert (await bundle.coord.retry(JobId(job_id=sub.jobs["narrate"]))).status == "waiting"
    wf = await bundle.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert wf.status == "running" and wf.summary is None
    assert [n.status for n in wf.nodes] == ["succeeded", "waiting", "blocked"]
    await run_node(bundle, "narrate", GOOD_CLAIMS)
    job, _ = await run_node(bundle, "build", {"markdown": "late"})
    assert job.payload["inputs"]["narrate"]["claims"]
    wf = await bundle.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert wf.status == "succeeded"


async def test_retry_of_dependency_skipped_node_waits_for_its_dependencies(bundle):
    await bundle.worker("g", roles=["gather"])
    sub = await bundle.coord.workflow_submit(story())
    got = await bundle.claim("g")
    await bundle.coord.fail(Fail(job_id=got.job.job_id, worker_id="g", token=got.lease.token,
                                 error="boom", retryable=False))
    # narrate was skipped because gather failed: retrying narrate alone skips it again
    assert (await bundle.coord.retry(JobId(job_id=sub.jobs["narrate"]))).status == "skipped"
    # retrying gather reopens the graph: narrate and build wait for it
    assert (await bundle.coord.retry(JobId(job_id=sub.jobs["gather"]))).status == "waiting"
    wf = await bundle.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert wf.status == "running"
    assert [n.status for n in wf.nodes] == ["waiting", "blocked", "blocked"]
    await run_node(bundle, "g", {"evidence": EVIDENCE})
    narrate = await bundle.coord.get_job(JobId(job_id=sub.jobs["narrate"]))
    assert narrate.status == "waiting" and narrate.payload["inputs"]["gather"]


async def test_prune_removes_finished_nodes_with_their_edges(make_bundle):
    bundle = await make_bundle(retention_s=3600.0, workflow_absent_wait_s=10)
    sub = await bundle.coord.workflow_submit(story())
    bundle.clock.advance(11)
    await bundle.coord.flows.tick()  # no workers at all: gather skipped, the rest follow
    wf = await bundle.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert wf.status == "failed" and wf.summary["missing_roles"] == ["gather"]
    bundle.clock.advance(3601)
    assert (await bundle.coord.prune()).pruned == 3
    assert (await bundle.coord.check()) == {"quick_check": "ok", "foreign_key_violations": 0,
                                            "invariants": []}
    with sqlite3.connect(bundle.db_path) as conn:
        assert conn.execute("SELECT count(*) FROM workflow_edges").fetchone()[0] == 0
    await bundle.coord.flows.tick()  # the workflow row goes once its jobs are gone
    assert (await bundle.coord.workflow_list(ListWorkflows())).workflows == []
    assert (await bundle.coord.check()) == {"quick_check": "ok", "foreign_key_violations": 0,
                                            "invariants": []}


async def test_workflow_cancel_ends_every_open_node(bundle):
    await bundle.worker("g", roles=["gather"])
    sub = await bundle.coord.workflow_submit(story())
    got = await bundle.claim("g")  # gather running
    wf = await bundle.coord.workflow_cancel(WorkflowId(workflow_id=sub.workflow_id))
    assert [n.status for n in wf.nodes] == ["running", "cancelled", "cancelled"]
    gather = await bundle.coord.get_job(JobId(job_id=sub.jobs["gather"]))
    assert gather.cancel_requested
    reply = await bundle.coord.complete(Complete(job_id=got.job.job_id, worker_id="g",
                                                 token=got.lease.token, result={}))
    assert reply.status == "cancelled"
    wf = await bundle.coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert wf.status == "cancelled" and len(wf.summary["cancelled"]) == 3
    with pytest.raises(errors.NotFound):
        await bundle.coord.workflow_cancel(WorkflowId(workflow_id="nope"))


async def test_no_worker_absent_skip_until_coordd_itself_has_waited(tmp_path):
    """After a restart (or a long downtime) the workers' old heartbeats are stale: nothing
    is skipped until this coordd has run for workflow_absent_wait_s itself."""
    path = str(tmp_path / "r.db")
    clock = FakeClock(T0)
    coord = await open_coord(path, clock)
    await coord.heartbeat(Heartbeat(worker_id="b", roles=["build"], readings={}))
    sub = await coord.workflow_submit(_convert({"name": "one", "nodes": [
        {"name": "n", "kind": "build", "required_role": "build"}]}))
    await coord.close()
    clock.advance(3600)  # coordd was down for an hour
    coord = await open_coord(path, clock)
    clock.advance(5)
    assert (await coord.flows.tick())[0] == 0  # the node waited 3605 s, but not on our watch
    clock.advance(290)  # 295 s up, b silent since before the restart: still not judged
    assert (await coord.flows.tick())[0] == 0
    clock.advance(10)  # 305 s up: b has not come back, the capability is gone
    assert (await coord.flows.tick())[0] == 1
    wf = await coord.workflow_get(WorkflowId(workflow_id=sub.workflow_id))
    assert wf.status == "failed" and wf.summary["missing_roles"] == ["build"]
    await coord.close()
